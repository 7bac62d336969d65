// Where a request's outputs go. The caller that submits a request owns an OutputSink; the backend
// asks it for the memory of each output the request asked for and writes that output's bytes
// there, once. The gRPC path's sink is the response message itself (raw_output_contents); later
// transports (an HTTP binary body, shared-memory outputs) are other sinks. Nothing here pulls in
// protobuf or torch.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

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
};

// A sink that keeps the outputs as Tensors: tests, warm-up, the in-process benchmark, and the
// padding layer (which cuts padded outputs before they reach the caller's sink). Every output's
// memory stays where it was handed out while more outputs are allocated.
class TensorSink final : public OutputSink {
 public:
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::vector<Tensor>& outputs() { return outputs_; }
  // Total bytes handed out (what the backend wrote), for tests that count copies.
  size_t bytes() const { return bytes_; }

 private:
  std::vector<Tensor> outputs_;
  size_t bytes_ = 0;
};

// One request's share of an execution: its rows of the batch (consecutive, in the order targets
// are given), the outputs it asked for, and where they go.
struct OutputTarget {
  int64_t rows = 1;                                      // this request's batch size
  const std::vector<std::string>* requested = nullptr;  // empty or null: every declared output
  OutputSink* sink = nullptr;                            // never null
};

// One whole-batch output on the host, as a backend has it after the forward pass.
struct HostOutput {
  const std::string* name = nullptr;
  DataType dtype = DataType::kFp32;
  Shape shape;                 // batch dimension first when the model batches
  const char* data = nullptr;  // row-major, contiguous
  size_t byte_size = 0;
  MemoryType memory = MemoryType::kCpu;
};

// Hands every target its rows of every output it asked for: one Allocate and one memcpy per
// (target, requested output). `outputs` are the model's declared outputs in config order;
// `batched`: their first dimension is the batch (rows are split across targets, padding rows at
// the end are dropped), else the one target gets each output whole. A BYTES output's data is in
// the serialized form of server/core/bytes_tensor.h, and its rows are found by element count.
// INTERNAL when a batched output's first dimension is not the execution's rows; a sink's error is
// returned as it is.
Status DeliverOutputs(absl::Span<const HostOutput> outputs, absl::Span<const OutputTarget> targets,
                      bool batched);

}  // namespace sluice
