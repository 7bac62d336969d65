// Where a request's outputs go. The caller that submits a request owns an OutputSink; the backend
// asks it for the memory of each output the request asked for and writes that output's bytes
// there, once. The gRPC path's sink is the response message itself (raw_output_contents); later
// transports (an HTTP binary body, shared-memory outputs) are other sinks. Nothing here pulls in
// protobuf or torch.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"

#include "absl/types/span.h"

#include "server/core/status.h"
#include "server/core/tensor.h"

namespace sluice {

// Where the backend will read the bytes it writes into a sink from. Only host memory is handed to
// sinks today: a GPU backend copies device -> pinned staging -> sink.
enum class MemoryType { kCpu, kCpuPinned };

// One output of one request, as the backend describes it before writing.
struct OutputDescription {
  const std::string& name;
  DataType dtype;
  const Shape& shape;  // this request's shape (its own batch dimension when the model batches)
  size_t byte_size;    // bytes the backend will write
  MemoryType source;   // where those bytes come from
};

// A client connection whose writes can be held back while several answers are written to it
// one after the other (a batch's answers to one caller), so that they leave together instead of
// in one network segment each: for gRPC over TCP, TCP_CORK on the connection's socket
// (grpc/tcp_connections.h). Holding is only ever an optimisation: a connection that cannot be
// held (closed meanwhile, say) says so, and answers then leave as they would have. Thread-safe.
class AnswerConnection {
 public:
  virtual ~AnswerConnection() = default;
  // Whether the writes are now held; if so, the same thread calls Release once the answers'
  // completions have run, which sends what was held. Two threads may hold one connection at
  // once: the first Release sends what both held so far.
  virtual bool Hold() = 0;
  virtual void Release() = 0;
};

// Thread-compatible: a sink belongs to one request, and only the worker running that request
// calls it, between the forward pass and the request's completion. Memory a sink hands out stays
// valid and untouched by the sink until the completion has run.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // Memory for `output`'s bytes, or why not (that request then fails with this status; the
  // other requests of its batch do not). Called at
  // most once per output per request, in the order of the request's requested_outputs (every
  // declared output in config order when that is empty), after the forward pass, so that outputs
  // whose shape depends on the data are sized exactly.
  virtual StatusOr<char*> Allocate(const OutputDescription& output) = 0;
  // The connection this request's answer will be written to, when its transport can hold that
  // connection's writes (AnswerConnection); null (the default) otherwise. Asked on the worker
  // before the request's completion runs, and only for executions of several requests
  // (AnswerConnections; padding fillers are not asked). A sink that wraps another's caller
  // forwards it; one that outlives no single caller (single flight's) must not.
  virtual std::shared_ptr<AnswerConnection> Connection() { return nullptr; }

  // Whether this sink takes output `name` as a HeldTensor where the backend can leave it on its
  // device (Hold): an output whose reader is another model (an ensemble's next step), not a
  // transport. Asked after the forward pass; the same answer for a name every time.
  virtual bool TakesHeld(const std::string& /*name*/) const { return false; }
  // Takes `output` as `tensor`, its bytes left where the backend made them: called instead of
  // Allocate (same order, same once-per-output rule) for an output the backend holds, only when
  // TakesHeld(its name). Never for BYTES outputs.
  virtual Status Hold(const OutputDescription& output, std::shared_ptr<HeldTensor> tensor);
};

// The connections that two or more answers of one execution go to, held while those answers
// are sent: Add each caller's sink before the completions run, Hold, run them, then Release
// (also on destruction). A connection only one answer goes to is not held: holding it would
// delay nothing and cost two system calls. Thread-compatible.
class AnswerConnections {
 public:
  AnswerConnections() = default;
  AnswerConnections(const AnswerConnections&) = delete;
  AnswerConnections& operator=(const AnswerConnections&) = delete;
  ~AnswerConnections() { Release(); }

  void Add(OutputSink* sink);
  // Holds every connection added at least twice; returns how many are held.
  size_t Hold();
  void Release();

 private:
  struct Entry {
    std::shared_ptr<AnswerConnection> connection;
    int answers = 0;
    bool held = false;
  };
  absl::InlinedVector<Entry, 4> entries_;  // one per distinct connection, in the order first added
};

// A sink that keeps the outputs as Tensors: tests, warm-up, the in-process benchmark, and the
// padding layer (which cuts padded outputs before they reach the caller's sink). Every output's
// memory stays where it was handed out while more outputs are allocated.
class TensorSink final : public OutputSink {
 public:
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::vector<Tensor>& outputs() { return outputs_; }
  const std::vector<Tensor>& outputs() const { return outputs_; }
  // Total bytes handed out (what the backend wrote), for tests that count copies.
  size_t bytes() const { return bytes_; }

 private:
  std::vector<Tensor> outputs_;
  size_t bytes_ = 0;
};

// One request's share of an execution: its rows of the batch (consecutive, in the order targets
// are given), the outputs it asked for, and where they go.
struct OutputTarget {
  int64_t rows = 1;                                     // this request's batch size
  const std::vector<std::string>* requested = nullptr;  // empty or null: every declared output
  OutputSink* sink = nullptr;                           // never null
};

// Hands out rows of one whole-batch output as held tensors (the backend's own, left where they
// are).
class OutputHolder {
 public:
  virtual ~OutputHolder() = default;
  // Rows [first_row, first_row + shape[0]) of the output (the whole output for a model that
  // does not batch), shaped `shape` (the target's: its rows first; the config's dims where it
  // reshapes).
  virtual StatusOr<std::shared_ptr<HeldTensor>> Rows(int64_t first_row,
                                                     const Shape& shape) const = 0;
};

// One whole-batch output, as a backend has it after the forward pass: on the host, or held on
// its device (`holder`), or both.
struct HostOutput {
  const std::string* name = nullptr;
  DataType dtype = DataType::kFp32;
  Shape shape;                 // batch dimension first when the model batches
  const char* data = nullptr;  // row-major, contiguous; null when only held targets want it
  size_t byte_size = 0;
  MemoryType memory = MemoryType::kCpu;
  const OutputHolder* holder = nullptr;  // non-null: targets whose sinks TakesHeld get it held
};

// Hands every target its rows of every output it asked for: one Allocate and one memcpy per
// (target, requested output). `outputs` are the model's declared outputs in config order;
// `batched`: their first dimension is the batch (rows are split across targets, padding rows at
// the end are dropped), else the one target gets each output whole. A target whose sink
// TakesHeld an output that has a holder gets it as a held tensor (Hold), no bytes copied; the
// others need its `data`. A BYTES output's data is in
// the serialized form of server/core/bytes_tensor.h, and its rows are found by element count.
// INTERNAL when a batched output's first dimension is not the execution's rows; a sink's error is
// returned as it is.
Status DeliverOutputs(absl::Span<const HostOutput> outputs, absl::Span<const OutputTarget> targets,
                      bool batched);

}  // namespace sluice
