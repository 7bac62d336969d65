#include "server/api/inference_path.h"

#include "server/core/logging.h"

namespace sluice {

void RunInference(const ModelLookup& lookup, InferenceCall* call) {
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
  call->Accepted(*request, model);
  // The call's hold keeps the version in flight until the answer; `model`, a second hold, keeps
  // it alive until Submit has returned (the answer may come before that).
  call->hold.Set(model.Another());
  model->Submit(std::move(request), call->sink(), [call](Status status) {
    if (!status.ok()) {
      spdlog::debug("event=infer_failed protocol={} model={} request_id={} reason=\"{}\"",
                    ProtocolName(call->protocol), call->model_name(), call->request_id(), status.message());
    }
    call->hold.Release();
    call->Answer(status);
  });
}

}  // namespace sluice
