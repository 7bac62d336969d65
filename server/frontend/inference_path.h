// The inference path every front end shares (gRPC ModelInfer, gRPC ModelStreamInfer, HTTP POST
// .../infer), written once. A front end wraps one request in an InferenceCall (what differs: the
// codec, where the outputs go, how the answer is sent) and hands it to RunInference, which takes
// the steps in this order:
//   1. find the model version (ModelLookup::Find; NOT_FOUND / UNAVAILABLE are answered as they
//      are, except that a model that loads on demand (ModelLookup::on_demand) and is not loaded
//      is waited for, within the request's deadline, and the request goes on from step 1 on the
//      thread that answers the wait)
//   2. decode the request for that model (the call's codec; a refusal counts as the model's
//      rejection in its statistics), and refuse an id longer than kMaxRequestIdBytes the same way
//   3. route a sequence to the version that holds it (RouteSequence)
//   4. stamp model name, protocol, deadline and cancellation flag on the request, and tell the
//      call the version that will answer (Accepted: a response header, a cancellation hook)
//   5. hold the version in flight (ModelHold) and submit (ModelHandle::Submit: validation, queue
//      timeout, scheduling); outputs asked for as classes go through a ClassifyingSink around
//      the call's sink (classification.h)
//   6. on the answer: the classified outputs are handed on (ClassifyingSink::Finish); a request
//   whose shared memory regions were truncated while it was in flight
//      (InferenceCall::shared_memory_refs) is answered INVALID_ARGUMENT instead; log a failure
//      (debug), release the hold, then Answer; a traced request's spans end when Answer has
//      returned (core/request_trace.h)
//   0. with client quotas on (InferenceCall::quotas), admit the request under its client's quota
//      (client_quotas.h): a refusal is the answer; the admission's ticket is held until the answer
//   7. once the request was submitted (step 5), or answered before it, tell the call's
//      submission_observer (for a request that waited for its model, after the wait)
//
// Where the protocols differ, and only there:
//               gRPC (unary and stream)                    HTTP
//   decode      ModelInferRequest (protocol.cc); inputs    JSON with Triton's binary extension
//               and outputs may name shared memory         (json_protocol.cc); FP16/BF16 outputs
//                                                          must be asked for as binary
//   deadline    the caller's gRPC deadline                 none (HTTP carries no deadline)
//   cancelled   the call's OnCancel; a stream's end        the connection closing
//               cancels every request of the stream
//   answer      a gRPC status (unary); the response's      {"error": "..."} with ToHttpStatusCode's
//               error_message, the stream going on         code
// Request parameters are read by one reader for both (request_parameters.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

#include "server/core/clock.h"
#include "server/core/infer_request.h"
#include "server/core/output_sink.h"
#include "server/core/status.h"
#include "server/frontend/client_quotas.h"
#include "server/frontend/shared_memory.h"
#include "server/manager/model_handle.h"

namespace sluice {

// Told when a request has been handed on: queued with its model's scheduler, or answered without
// reaching one. A stream reads its next request only then, so that its requests reach their models
// in the order it sent them (the steps of a sequence). Called on any thread: usually inside
// RunInference, after Submit (and perhaps after the answer); for a request that waited for its
// model to load, on the thread that answered the wait. Never under a lock of the path's.
class SubmissionObserver {
 public:
  virtual void Submitted() = 0;

 protected:
  ~SubmissionObserver() = default;
};

// One inference request as its front end carries it. The front end sets the public fields, then
// calls RunInference, handing the call over (the path destroys it after Answer) or keeping it
// (then it must stay alive, with whatever Decode's request views, until Answer has run).
class InferenceCall {
 public:
  virtual ~InferenceCall() = default;

  Protocol protocol = Protocol::kGrpc;
  TimePoint deadline = kNoDeadline;  // the caller's own (the queue timeout may narrow it)
  std::shared_ptr<std::atomic<bool>> cancelled;  // set when the caller goes away; may be null
  bool caller_may_run = false;                   // see InferRequest::caller_may_run
  // The request's trace when the front end's tracer sampled it (null: not traced). The path puts
  // the model's attributes on it, hands it to the request, and ends it once Answer has returned.
  std::shared_ptr<RequestTrace> trace;
  // The version the request runs on, from submission until just before Answer: an unload waits
  // for the answer, not for the transport. A cancellation may Poke it from another thread.
  ModelHold hold;
  // Told once the request has been handed on (may be null): usually before RunInference returns;
  // for a request that waits for its model to load on demand, later, on the thread that answers
  // the wait. It must outlive that moment; the call may not (it is not touched for this).
  SubmissionObserver* submission_observer = nullptr;
  // The shared memory regions Decode resolves the request's inputs and outputs into (null: none
  // can be; alive as the call). Checked before the answer (SharedMemoryRefs::CheckIntact): a
  // client that shrank a region's object while the request was in flight gets INVALID_ARGUMENT,
  // not the result computed from, or written into, zero pages.
  const SharedMemoryRefs* shared_memory_refs = nullptr;
  // The quotas the request is admitted under (step 0) and its client's identity (the front end's
  // ClientQuotas::Identify); null: quotas are off. Both outlive the call.
  ClientQuotas* quotas = nullptr;
  std::string client;
  // The admission, released just before Answer (the request is no longer in flight).
  ClientQuotas::Ticket quota_ticket;

  // The model and version asked for (version empty: the newest ready one); alive as the call.
  virtual const std::string& model_name() const = 0;
  virtual const std::string& model_version() const = 0;
  // The request for `model`, from the call's bytes: the protocol's checks and conversion (the
  // model-level checks are ModelHandle::Submit's). INVALID_ARGUMENT naming what is wrong.
  virtual StatusOr<std::unique_ptr<InferRequest>> Decode(const ModelHandle& model) = 0;
  // The decoded request goes to `model` (after sequence routing); called once, before
  // submission, on the thread that runs RunInference. From submission on only the thread that
  // answers touches the call's response.
  virtual void Accepted(const InferRequest& /*request*/, const InFlightModel& /*model*/) {}
  // Where the outputs go; called once, after Accepted.
  virtual OutputSink* sink() = 0;
  // The client's request id, for the failure log; read when the answer comes.
  virtual absl::string_view request_id() const = 0;
  // Exactly once, on whichever thread answers (a model worker, or the caller of RunInference for
  // an early error), with the hold already released. A call its owner keeps may be destroyed by
  // that owner from here on.
  virtual void Answer(const Status& status) = 0;
};

// Takes `call` through the steps above and destroys it once answered. Never blocks on model work.
void RunInference(const ModelLookup& lookup, std::unique_ptr<InferenceCall> call);
// The same for a call whose owner keeps it (a gRPC reactor, which gRPC destroys after Finish).
void RunInference(const ModelLookup& lookup, InferenceCall* call);

}  // namespace sluice
