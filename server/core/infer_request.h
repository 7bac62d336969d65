// The validated, protocol-free form of one inference call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/core/clock.h"
#include "server/core/message_text.h"
#include "server/core/request_trace.h"
#include "server/core/tensor.h"

namespace sluice {

// The front end a request came through; metrics label the per-request series with it.
enum class Protocol { kGrpc, kHttp };
inline constexpr Protocol kAllProtocols[] = {Protocol::kGrpc, Protocol::kHttp};
inline const char* ProtocolName(Protocol protocol) {
  return protocol == Protocol::kHttp ? "http" : "grpc";
}

// The longest request id the front ends take (RunInference refuses a longer one): clients send a
// few dozen bytes (a UUID is 36, perf_analyzer and tritonclient's examples send counters), and the
// id is echoed in the response and written to logs and traces.
inline constexpr size_t kMaxRequestIdBytes = 1024;

// A correlation id (Triton's sequence_id parameter): an unsigned number or a string. Zero and the
// empty string mean "no sequence".
struct CorrelationId {
  uint64_t number = 0;
  std::string text;
  bool is_text = false;

  bool present() const { return is_text ? !text.empty() : number != 0; }
  // For messages and logs: the number, or the client's string quoted (QuoteClientText).
  std::string ToString() const {
    return is_text ? "'" + QuoteClientText(text) + "'" : std::to_string(number);
  }
  bool operator<(const CorrelationId& other) const {
    if (is_text != other.is_text) return is_text < other.is_text;
    return is_text ? text < other.text : number < other.number;
  }
  bool operator==(const CorrelationId& other) const {
    return is_text == other.is_text && (is_text ? text == other.text : number == other.number);
  }
};

// Triton's sequence parameters (sequence_id, sequence_start, sequence_end). Only a model with
// sequence_batching acts on them; other models ignore them, as Triton's do.
struct SequenceControl {
  CorrelationId id;
  bool start = false;
  bool end = false;
};

// The request's parameters that Sluice acts on.
struct RequestParameters {
  // Queue timeout in microseconds ("timeout"); 0: the model's default. Honoured only when the
  // model's dynamic_batching allows timeout overrides.
  int64_t timeout_us = 0;
  // Priority ("priority"): 1 is the highest; 0 (none given) or a value above the model's
  // priority_levels means its default_priority_level. Ignored by models without priority levels.
  uint64_t priority = 0;
  SequenceControl sequence;
};

// One output the caller asked for as its top classes instead of the tensor (Triton's
// classification extension: the output parameter "classification" = count > 0).
struct ClassificationRequest {
  std::string output;  // a requested output's name
  int64_t count = 0;   // classes per batch row (fewer when a row has fewer elements)
};

// Where a row's implicit sequence state lives (a model with sequence_batching `state`): the slot
// of its instance's state store that feeds the row's state inputs and keeps its state outputs.
struct StateRow {
  int32_t slot = -1;   // -1: no sequence (a filler or warm-up row): initial state in, none kept
  bool start = false;  // the sequence's first request: initial state in, whatever the slot held
};

// Ownership: `inputs` view bytes that belong either to the caller's transport message (which the
// caller keeps alive until the request's completion has run) or to `owned_buffers` (typed
// contents converted into raw bytes). Moving an InferRequest keeps the views valid: the buffers'
// heap storage does not move.
struct InferRequest {
  std::string model_name;
  int64_t model_version = 0;  // resolved version; 0 before resolution
  std::string id;             // client's request id, echoed back; at most kMaxRequestIdBytes
  Protocol protocol = Protocol::kGrpc;
  std::vector<TensorView> inputs;
  std::vector<std::string> requested_outputs;  // empty: every output, in config order
  std::vector<std::unique_ptr<std::string>> owned_buffers;
  // Requested outputs answered as "<score>:<index>[:<label>]" strings (frontend/classification.h);
  // each names an entry of requested_outputs. The model still computes, and the response cache
  // still keeps, the tensor: the classes are made from it on the way back to the caller.
  std::vector<ClassificationRequest> classifications;

  // Batch size of this request: the first dimension of its inputs when the model batches, else 1.
  int64_t batch_size = 1;
  // Set by the sequence batcher for a model with implicit state: one per row. Empty: every row is
  // without a sequence (StateRow's default).
  std::vector<StateRow> state_rows;

  // What the caller asked for besides tensors, protocol-neutral.
  RequestParameters parameters;

  // Scheduling. `deadline`: the transport sets the caller's own deadline (kNoDeadline: none);
  // ModelHandle::Submit narrows it to the queue timeout. A request still queued then is answered
  // DEADLINE_EXCEEDED without running. `cancelled` is set by the transport when the caller goes
  // away (may be null).
  TimePoint deadline = kNoDeadline;
  std::shared_ptr<std::atomic<bool>> cancelled;
  // Set by ModelHandle::Submit from the model's queue policies. `priority_level`: the level it
  // waits at (1 is the highest; 0: the model has no priority levels). `delay_after`: under a
  // timeout_action DELAY policy, its queue timeout (it then waits behind the requests that have
  // not timed out instead of failing; `deadline` keeps only the caller's own).
  int priority_level = 0;
  TimePoint delay_after = kNoDeadline;
  // The thread that submits the request may run it itself, when its model allows that
  // (sluice.run_on_receiving_thread) and nothing waits for the instance. Set by a front end whose
  // thread may be held for one forward pass: gRPC unary calls (not a stream, whose next reads
  // would wait, nor HTTP's event loop, which serves other connections).
  bool caller_may_run = false;
  // An input or output is in the client's shared memory, which the client may rewrite while the
  // request runs: the response cache's single flight never writes a shared answer there first
  // (others copy it from where it was written). Set by the front ends.
  bool shared_memory = false;
  // Set when the request was sampled for tracing (the front end's tracer decided); null
  // otherwise, which is all that tracing costs a request that is not traced. Shared with the
  // front end's call, which ends it when the answer is handed to the transport.
  std::shared_ptr<RequestTrace> trace;

  // Total bytes of input data (what the request costs while queued).
  size_t InputBytes() const {
    size_t bytes = 0;
    for (const TensorView& input : inputs) bytes += input.byte_size;
    return bytes;
  }
  bool HasHeldInputs() const {
    for (const TensorView& input : inputs) {
      if (!input.held.empty()) return true;
    }
    return false;
  }
  // Brings every held input to host memory this request owns (LoadHeldRows): for the
  // schedulers that read input bytes (a response cache key, shape padding).
  Status LoadHeldInputs() {
    for (TensorView& input : inputs) {
      if (input.held.empty()) continue;
      auto buffer = std::make_unique<std::string>();
      SLUICE_RETURN_IF_ERROR(LoadHeldRows(&input, buffer.get()));
      owned_buffers.push_back(std::move(buffer));
    }
    return absl::OkStatus();
  }
  bool IsCancelled() const { return cancelled && cancelled->load(std::memory_order_relaxed); }

  // Appends an input whose bytes this request owns (warm-up data, server-filled inputs).
  void AddOwnedInput(std::string name, DataType dtype, Shape shape, std::string bytes) {
    auto buffer = std::make_unique<std::string>(std::move(bytes));
    TensorView view;
    view.name = std::move(name);
    view.dtype = dtype;
    view.shape = std::move(shape);
    view.data = buffer->data();
    view.byte_size = buffer->size();
    owned_buffers.push_back(std::move(buffer));
    inputs.push_back(std::move(view));
  }
};

}  // namespace sluice
