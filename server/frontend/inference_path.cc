#include "server/frontend/inference_path.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/logging.h"
#include "server/core/message_text.h"
#include "server/frontend/classification.h"

namespace sluice {

namespace {

InferenceCall* Get(InferenceCall* call) { return call; }
InferenceCall* Get(const std::unique_ptr<InferenceCall>& call) { return call.get(); }

// Answers `call` and ends its trace, if it has one, once the answer is handed over (Answer may
// destroy the call).
void Answer(InferenceCall* call, const Status& status) {
  std::shared_ptr<RequestTrace> trace = std::move(call->trace);
  call->quota_ticket.Release();
  call->Answer(status);
  if (trace) trace->End(status, Clock::now());
}

// Names the model version on a traced request's span (the model asked for and the protocol are
// named when the path starts, so that a request refused before it finds a version has them too).
void DescribeTrace(RequestTrace* trace, const InferRequest& request, const ModelHandle& model) {
  trace->AddAttribute("sluice.model_version", model.version());
  if (!request.id.empty()) trace->AddAttribute("sluice.request_id", request.id);
  if (request.parameters.priority != 0) {
    trace->AddAttribute("sluice.priority", static_cast<int64_t>(request.parameters.priority));
  }
  trace->AddAttribute("sluice.batch_size", request.batch_size);
  trace->SetDevice(model.device());
}

// The decoded request, or INVALID_ARGUMENT for an id past kMaxRequestIdBytes (the same refusal over
// both protocols, counted as a decoding refusal).
StatusOr<std::unique_ptr<InferRequest>> CheckRequestId(
    StatusOr<std::unique_ptr<InferRequest>> decoded) {
  if (!decoded.ok() || (*decoded)->id.size() <= kMaxRequestIdBytes) return decoded;
  return absl::InvalidArgumentError(absl::StrCat(
      "the request id '", QuoteClientText((*decoded)->id, 64), "' is longer than the ",
      kMaxRequestIdBytes, " bytes this server takes; send a shorter id (a UUID or a counter)"));
}

// How many times one request waits for its model to load on demand: a model evicted again before
// the request found it (another load needed the room) is waited for once more, then the request
// is answered as Find answers it.
constexpr int kMaxLoadWaits = 2;

// Whether Run handed the request on (submitted it, or answered it) or parked it to wait for its
// model's load (then the wait's answer hands it on, and tells the observer, on whichever thread
// gives that answer: the loader's, or this one when the wait is answered at once).
enum class Handed { kNow, kAfterTheLoad };

// `Call`: InferenceCall* (its owner keeps it) or unique_ptr (owned here, then by the completion).
// `cold_since`: when the request arrived, for one that waited `waits` times for its model to
// load on demand (zero: it did not wait). `observer`: the call's submission_observer, read
// before anything could destroy the call.
template <typename Call>
Handed Run(const ModelLookup& lookup, Call owned, SubmissionObserver* observer,
           TimePoint cold_since = {}, int waits = 0) {
  InferenceCall* call = Get(owned);
  if (call->trace && waits == 0) {
    call->trace->AddAttribute("sluice.model", call->model_name());
    call->trace->AddAttribute("sluice.protocol", std::string(ProtocolName(call->protocol)));
  }
  StatusOr<InFlightModel> found = lookup.Find(call->model_name(), call->model_version());
  if (!found.ok()) {
    OnDemandLoads* loads = lookup.on_demand();
    if (loads == nullptr || waits >= kMaxLoadWaits || !absl::IsUnavailable(found.status()) ||
        !loads->LoadsOnDemand(call->model_name())) {
      Answer(call, found.status());
      return Handed::kNow;
    }
    // Not loaded: wait for its load (the front end's thread returns now). The answer to the wait
    // usually comes on another thread, which then runs the request on, never the model, on its own.
    const TimePoint since = waits == 0 ? Clock::now() : cold_since;
    const std::string name = call->model_name();
    const TimePoint deadline = call->deadline;
    std::shared_ptr<std::atomic<bool>> cancelled = call->cancelled;
    auto held =
        std::make_shared<Call>(std::move(owned));  // std::function needs a copyable callable
    loads->Await(
        name, deadline, std::move(cancelled),
        [&lookup, held, observer, since, waits](const Status& status) {
          InferenceCall* waited = Get(*held);
          if (!status.ok()) {
            Answer(waited, status);
          } else {
            waited->caller_may_run = false;
            if (Run(lookup, std::move(*held), observer, since, waits + 1) == Handed::kAfterTheLoad)
              return;
          }
          if (observer != nullptr) observer->Submitted();
        });
    return Handed::kAfterTheLoad;
  }
  InFlightModel model = *std::move(found);
  model->MarkUsed();
  StatusOr<std::unique_ptr<InferRequest>> decoded = CheckRequestId(call->Decode(*model));
  if (!decoded.ok()) {
    const Status rejected = model->Reject(decoded.status(), call->protocol);
    model.Reset();  // released before the answer, as for every other answer
    Answer(call, rejected);
    return Handed::kNow;
  }
  std::unique_ptr<InferRequest> request = *std::move(decoded);
  model = RouteSequence(lookup, std::move(model), *request, !call->model_version().empty());
  request->model_name.assign(call->model_name());
  request->protocol = call->protocol;
  request->deadline = call->deadline;
  request->cancelled = call->cancelled;
  request->caller_may_run = call->caller_may_run;
  if (call->trace) {
    DescribeTrace(call->trace.get(), *request, *model);
    request->trace = call->trace;
  }
  call->Accepted(*request, model);
  // The call's hold keeps the version in flight until the answer; `model`, a second hold, keeps
  // it alive until Submit has returned (the answer may come before that). From Submit on the
  // completion owns an owned call: nothing here touches `call` after it.
  call->hold.Set(model.Another());
  OutputSink* sink = call->sink();
  // Outputs asked for as classes go through a sink that turns each into its classes on the way.
  std::unique_ptr<ClassifyingSink> classifying;
  if (!request->classifications.empty()) {
    classifying = std::make_unique<ClassifyingSink>(sink, model->spec(), request->classifications);
    sink = classifying.get();
  }
  model->Submit(std::move(request), sink,
                [owned = std::move(owned), classifying = std::move(classifying), &lookup,
                 cold_since](Status status) {
                  InferenceCall* call = Get(owned);
                  if (status.ok() && classifying != nullptr) status = classifying->Finish();
                  if (call->shared_memory_refs != nullptr) {
                    if (Status intact = call->shared_memory_refs->CheckIntact(); !intact.ok())
                      status = std::move(intact);
                  }
                  if (!status.ok()) {
                    spdlog::debug(
                        "event=infer_failed protocol={} model=\"{}\" request_id=\"{}\" "
                        "reason=\"{}\"",
                        ProtocolName(call->protocol), QuoteClientText(call->model_name()),
                        QuoteClientText(call->request_id(), 64), status.message());
                  } else if (cold_since != TimePoint{}) {
                    if (OnDemandLoads* loads = lookup.on_demand())
                      loads->RecordColdStart(call->model_name(), Clock::now() - cold_since);
                  }
                  call->hold.Release();
                  Answer(call, status);
                });
  return Handed::kNow;
}

template <typename Call>
void RunAndTell(const ModelLookup& lookup, Call owned) {
  SubmissionObserver* observer = Get(owned)->submission_observer;
  if (InferenceCall* call = Get(owned); call->quotas != nullptr) {
    StatusOr<ClientQuotas::Ticket> admitted = call->quotas->Admit(call->client);
    if (!admitted.ok()) {
      spdlog::debug("event=infer_refused protocol={} model=\"{}\" client=\"{}\" reason=\"{}\"",
                    ProtocolName(call->protocol), QuoteClientText(call->model_name()),
                    QuoteClientText(call->client), admitted.status().message());
      Answer(call, admitted.status());
      if (observer != nullptr) observer->Submitted();
      return;
    }
    call->quota_ticket = *std::move(admitted);
  }
  if (Run(lookup, std::move(owned), observer) == Handed::kNow && observer != nullptr)
    observer->Submitted();
}

}  // namespace

void RunInference(const ModelLookup& lookup, std::unique_ptr<InferenceCall> call) {
  RunAndTell(lookup, std::move(call));
}
void RunInference(const ModelLookup& lookup, InferenceCall* call) { RunAndTell(lookup, call); }

}  // namespace sluice
