// Padding buckets: a request's variable dimensions are padded up to the next bucket size before
// it is queued (so requests of one bucket batch together and the model sees a finite set of
// shapes), and the outputs that follow a padded axis are cut back to the request's true length
// (UnpaddingSink).
//
// Padding changes what a model computes unless the model ignores padded positions: a model that
// mixes positions (attention, pooling over a sequence, convolutions across the padded edge) must
// take the true lengths from the lengths input (sluice.lengths_input) and mask with them.
#pragma once

#include <memory>
#include <vector>

#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/core/model_spec.h"

namespace sluice {

// What padding did to one request: per padding axis, the request's true length and the bucket
// it was padded to (-1 when no input has that axis).
struct PaddedLengths {
  std::vector<int64_t> lengths;
  std::vector<int64_t> buckets;
};

// Pads the bucketed dimensions of `request`'s inputs in place (the padded bytes live in the
// request's owned_buffers) and adds the lengths input when the model has one. INVALID_ARGUMENT
// when a length is 0 or above the largest bucket, or two inputs disagree on one axis. A padded
// input is at most (bucket / length) times the bytes the request sent for it.
StatusOr<PaddedLengths> PadRequest(const ModelSpec& spec, InferRequest* request);

// The sink a padded request's outputs go to first: an output that follows a padded axis (and
// every output after it, to keep their order) waits here at its bucket size; the others go
// straight to the caller's sink. Finish cuts the waiting ones back to the request's true lengths
// into the caller's sink: one more copy, for those outputs only. Thread-compatible (one request).
class UnpaddingSink final : public OutputSink {
 public:
  UnpaddingSink(std::shared_ptr<const ModelSpec> spec, PaddedLengths padded, OutputSink* inner);
  StatusOr<char*> Allocate(const OutputDescription& output) override;
  std::shared_ptr<AnswerConnection> Connection() override { return inner_->Connection(); }
  // INTERNAL when an output does not have the bucket size where sluice.bucket_dims says it
  // follows a padded axis; a caller's sink error as it is.
  Status Finish();

 private:
  const std::shared_ptr<const ModelSpec> spec_;
  const PaddedLengths padded_;
  OutputSink* const inner_;
  TensorSink kept_;
};

// The scheduler of a model with padding buckets: pads each request, hands it to `inner`, and
// unpads its response. Thread-safe as `inner` is. A padded request keeps its cancellation flag
// and its priority level: `inner`'s queue and caps are its (QueueSharing is the inner's).
class PaddingScheduler final : public Scheduler {
 public:
  PaddingScheduler(ModelSpec spec, std::unique_ptr<Scheduler> inner,
                   std::shared_ptr<ModelStats> stats);

  void Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
               InferCompletion done) override;
  void Poke() override { inner_->Poke(); }
  void Stop() override { inner_->Stop(); }
  StatusOr<WarmupReport> WarmUp(std::vector<WarmupRequest> requests,
                                const std::atomic<bool>* abandon) override;
  void SetBatchSizeLadder(std::vector<int> sizes) override {
    inner_->SetBatchSizeLadder(std::move(sizes));
  }
  // Ignored: a padded model's requests are handed over to the batcher's thread, never run on the
  // caller's (its padding copy is work enough for the front end).
  void SetCallerRuns(bool) override {}

 private:
  const std::shared_ptr<const ModelSpec> spec_;  // shared with the completions in flight
  const std::unique_ptr<Scheduler> inner_;
  const std::shared_ptr<ModelStats> stats_;  // may be null
};

}  // namespace sluice
