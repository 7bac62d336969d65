#include "server/frontend/inference_path.h"

#include "server/core/logging.h"

namespace sluice {

namespace {

InferenceCall* Get(InferenceCall* call) { return call; }
InferenceCall* Get(const std::unique_ptr<InferenceCall>& call) { return call.get(); }

// `Call`: InferenceCall* (its owner keeps it) or unique_ptr (owned here, then by the completion).
template <typename Call>
void Run(const ModelLookup& lookup, Call owned) {
  InferenceCall* call = Get(owned);
  StatusOr<InFlightModel> found = lookup.Find(call->model_name(), call->model_version());
  if (!found.ok()) return call->Answer(found.status());
  InFlightModel model = *std::move(found);
  StatusOr<std::unique_ptr<InferRequest>> decoded = call->Decode(*model);
  if (!decoded.ok()) {
    const Status rejected = model->Reject(decoded.status(), call->protocol);
    model.Reset();  // released before the answer, as for every other answer
    return call->Answer(rejected);
  }
  std::unique_ptr<InferRequest> request = *std::move(decoded);
  model = RouteSequence(lookup, std::move(model), *request, !call->model_version().empty());
  request->model_name.assign(call->model_name());
  request->protocol = call->protocol;
  request->deadline = call->deadline;
  request->cancelled = call->cancelled;
  request->caller_may_run = call->caller_may_run;
  call->Accepted(*request, model);
  // The call's hold keeps the version in flight until the answer; `model`, a second hold, keeps
  // it alive until Submit has returned (the answer may come before that). From Submit on the
  // completion owns an owned call: nothing here touches `call` after it.
  call->hold.Set(model.Another());
  OutputSink* sink = call->sink();
  model->Submit(std::move(request), sink, [owned = std::move(owned)](Status status) {
    InferenceCall* call = Get(owned);
    if (!status.ok()) {
      spdlog::debug("event=infer_failed protocol={} model={} request_id={} reason=\"{}\"",
                    ProtocolName(call->protocol), call->model_name(), call->request_id(), status.message());
    }
    call->hold.Release();
    call->Answer(status);
  });
}

}  // namespace

void RunInference(const ModelLookup& lookup, std::unique_ptr<InferenceCall> call) { Run(lookup, std::move(call)); }
void RunInference(const ModelLookup& lookup, InferenceCall* call) { Run(lookup, call); }

}  // namespace sluice
