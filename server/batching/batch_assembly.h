// Turning a FormedBatch into one batch request for the model. Each request's input bytes are
// copied exactly once, into the instance's staging buffers. (Outputs go the other way through
// each request's OutputSink: see ModelBackend::Execute.)
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "server/batching/batch_queue.h"
#include "server/core/backend.h"
#include "server/core/model_spec.h"

namespace sluice {

// One instance's staging buffers, one per model input, reused across batches and grown (never
// shrunk) when a batch needs more. Thread-compatible: owned by one worker thread.
class StagingPool {
 public:
  explicit StagingPool(ModelBackend* backend) : backend_(backend) {}

  // A buffer of at least `bytes` for input number `index`.
  char* Get(size_t index, size_t bytes);

  // Whether input `index`'s buffer (Get first) is copied on to a device.
  bool ForDevice(size_t index) const { return buffers_[index]->ForDevice(); }

  // How many buffers were allocated so far (tests check that this stays flat).
  size_t allocations() const { return allocations_.load(std::memory_order_relaxed); }

 private:
  ModelBackend* const backend_;
  std::vector<std::unique_ptr<StagingBuffer>> buffers_;
  std::atomic<size_t> allocations_{0};  // read by other threads for statistics
};

// Copies every request's inputs into `pool` (padding rows are zero; an input held in host memory
// is copied in too, counted on its tensor (through the host when the pool's buffer goes on to a
// device); one held on a device is listed by rows in the view's
// `held` instead, zero in the buffer, and no buffer is used for an input whose every request
// holds it on a device) and returns the request the
// model runs: the same inputs, `batch.padded_rows` rows, every output requested; for a model with
// implicit state, each row's StateRow (rows without one: no sequence).
InferRequest AssembleBatch(const ModelSpec& spec, const FormedBatch& batch, StagingPool* pool);

}  // namespace sluice
