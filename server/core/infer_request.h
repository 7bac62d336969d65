// The validated, protocol-free form of one inference call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/core/clock.h"
#include "server/core/tensor.h"

namespace sluice {

// Ownership: `inputs` view bytes that belong either to the caller's transport message (which the
// caller keeps alive until the request's completion has run) or to `owned_buffers` (typed
// contents converted into raw bytes). Moving an InferRequest keeps the views valid: the buffers'
// heap storage does not move.
struct InferRequest {
  std::string model_name;
  int64_t model_version = 0;  // resolved version; 0 before resolution
  std::string id;             // client's request id, echoed back
  std::vector<TensorView> inputs;
  std::vector<std::string> requested_outputs;  // empty: every output, in config order
  std::vector<std::unique_ptr<std::string>> owned_buffers;

  // Batch size of this request: the first dimension of its inputs when the model batches, else 1.
  int64_t batch_size = 1;

  // Scheduling. `deadline`: the caller's deadline or queue timeout, whichever comes first; a
  // request still queued then is answered DEADLINE_EXCEEDED without running. `cancelled` is
  // set by the transport when the caller goes away (may be null).
  TimePoint deadline = kNoDeadline;
  std::shared_ptr<std::atomic<bool>> cancelled;
  int64_t timeout_us = 0;  // the request's own "timeout" parameter, 0 when absent

  // Total bytes of input data (what the request costs while queued).
  size_t InputBytes() const {
    size_t bytes = 0;
    for (const TensorView& input : inputs) bytes += input.byte_size;
    return bytes;
  }
  bool IsCancelled() const { return cancelled && cancelled->load(std::memory_order_relaxed); }
};

// What the runtime produces for one request: outputs in the requested order.
struct InferResponse {
  std::vector<Tensor> outputs;
};

}  // namespace sluice
