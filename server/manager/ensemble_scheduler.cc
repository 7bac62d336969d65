#include "server/manager/ensemble_scheduler.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/message_text.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

std::string DescribeStep(const ModelSpec& spec, size_t step) {
  return absl::StrCat("ensemble '", spec.name, "' step ", step + 1, " (model '",
                      spec.ensemble.steps[step].model, "')");
}

// Two declared shapes (without the batch dimension) that some tensor can have both of.
bool Compatible(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i] && a[i] != -1 && b[i] != -1) return false;
  }
  return true;
}

std::string Describe(DataType dtype, const Shape& dims) {
  return absl::StrCat(DataTypeName(dtype), " [", absl::StrJoin(dims, ","), "]");
}

}  // namespace

// A step's outputs, read in place by the steps after it and by the ensemble's answer: held where
// the step's model made them (OutputSink::Hold), or bytes where a backend brings them to the host
// (strings; a composing model's response cache). Counts the copies between steps into the run's
// ledger. Thread-compatible: written by the step's worker, read once the step has answered.
class EnsembleScheduler::StepOutputs final : public OutputSink {
 public:
  // `read_by_steps`: the step model's outputs another step reads (the others only the caller).
  StepOutputs(std::shared_ptr<CopyLedger> ledger, const std::set<std::string>* read_by_steps)
      : ledger_(std::move(ledger)), read_by_steps_(read_by_steps) {}

  // An output only the caller reads comes to the host with the step's other answers (one wait);
  // held, it would be copied from the device per request when the ensemble answers.
  bool TakesHeld(const std::string& name) const override { return read_by_steps_->count(name) > 0; }
  StatusOr<char*> Allocate(const OutputDescription& output) override {
    // From pinned memory: a GPU's output that a later step reads and the step's model could not
    // hand over held (one only the caller reads is not a copy between steps).
    if (output.source == MemoryType::kCpuPinned && TakesHeld(output.name))
      ledger_->through_host.fetch_add(output.byte_size, std::memory_order_relaxed);
    return bytes_.Allocate(output);
  }
  Status Hold(const OutputDescription& output, std::shared_ptr<HeldTensor> tensor) override {
    ledger_->on_device.fetch_add(tensor->copied_at_birth(), std::memory_order_relaxed);
    tensor->set_ledger(ledger_);  // its readers count their copies here
    held_.emplace_back(output.name, std::move(tensor));
    return absl::OkStatus();
  }

  // Each output as a view named by the step model's output name.
  std::vector<TensorView> Views() const {
    std::vector<TensorView> views;
    for (const Tensor& output : bytes_.outputs()) {
      views.push_back(TensorView{
          output.name, output.dtype, output.shape, output.data.data(), output.data.size(), {}});
    }
    for (const auto& [name, tensor] : held_) {
      views.push_back(TensorView{name,
                                 tensor->dtype(),
                                 tensor->shape(),
                                 nullptr,
                                 tensor->byte_size(),
                                 {HeldRows{0, tensor}}});
    }
    return views;
  }

 private:
  const std::shared_ptr<CopyLedger> ledger_;
  const std::set<std::string>* const read_by_steps_;
  TensorSink bytes_;
  std::vector<std::pair<std::string, std::shared_ptr<const HeldTensor>>> held_;
};

// One ensemble request in flight.
struct EnsembleScheduler::Run {
  std::unique_ptr<InferRequest> request;  // the ensemble's; its inputs view the caller's bytes
  OutputSink* sink = nullptr;
  InferCompletion done;
  TimePoint started;
  // The steps' own cancellation flag: set when the caller goes away or a step fails.
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  // Copies of tensors between this request's steps (StepOutputs, and the readers of its tensors).
  std::shared_ptr<CopyLedger> copies = std::make_shared<CopyLedger>();
  std::vector<std::unique_ptr<StepOutputs>> sinks;  // by step: its outputs, read in place

  Mutex mutex;
  // The ensemble tensors that exist: the request's inputs, then each answered step's outputs.
  std::map<std::string, TensorView> tensors ABSL_GUARDED_BY(mutex);
  std::vector<int> waiting ABSL_GUARDED_BY(mutex);          // by step: writers not answered yet
  std::vector<InFlightModel> holds ABSL_GUARDED_BY(mutex);  // by step, while it is in flight
  // By step, while it is in flight, when the ensemble's request is traced: the step's own.
  std::vector<std::shared_ptr<RequestTrace>> traces ABSL_GUARDED_BY(mutex);
  int in_flight ABSL_GUARDED_BY(mutex) = 0;    // steps started, not answered
  size_t answered ABSL_GUARDED_BY(mutex) = 0;  // steps answered OK
  Status failure ABSL_GUARDED_BY(mutex);       // the first step's failure
  bool finished ABSL_GUARDED_BY(mutex) = false;
};

StatusOr<std::unique_ptr<EnsembleScheduler>> EnsembleScheduler::Create(ModelSpec spec,
                                                                       Options options) {
  if (options.lookup == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError("an ensemble scheduler needs a model lookup and a clock");
  }
  if (!spec.is_ensemble()) return absl::InvalidArgumentError("not an ensemble");
  // What each ensemble tensor is: declared by the ensemble (inputs and outputs), or by the step
  // model output that writes it.
  struct Known {
    DataType dtype;
    Shape dims;
    std::string from;
  };
  std::map<std::string, Known> known;
  for (const TensorSpec& input : spec.inputs) {
    known[input.name] = {input.dtype, input.dims, absl::StrCat("the ensemble's input")};
  }
  const std::vector<EnsembleStepSpec>& steps = spec.ensemble.steps;
  // Writers first (the parser proved an order exists), so readers find what they read.
  std::vector<const ModelSpec*> models(steps.size(), nullptr);
  std::vector<InFlightModel> holds;
  for (size_t i = 0; i < steps.size(); ++i) {
    StatusOr<InFlightModel> found = options.lookup->Find(steps[i].model, steps[i].VersionText());
    if (!found.ok()) {
      return absl::UnavailableError(absl::StrCat(
          DescribeStep(spec, i), " cannot be served: ", found.status().message(),
          " (load the ensemble's models before it, or load it in explicit mode, which loads "
          "them)"));
    }
    models[i] = &(*found)->spec();
    holds.push_back(*std::move(found));  // keeps the spec alive while it is checked
    const ModelSpec& model = *models[i];
    if (model.is_ensemble()) {
      return absl::InvalidArgumentError(
          absl::StrCat(DescribeStep(spec, i), " is an ensemble; a step runs a model"));
    }
    if (spec.batches() && model.max_batch_size < spec.max_batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(DescribeStep(spec, i), " takes batches of at most ", model.max_batch_size,
                       " (max_batch_size), less than the ensemble's ", spec.max_batch_size));
    }
    if (!spec.batches() && model.batches()) {
      return absl::InvalidArgumentError(absl::StrCat(
          DescribeStep(spec, i), " batches (max_batch_size ", model.max_batch_size,
          ") but the ensemble does not (max_batch_size 0): give the ensemble a max_batch_size"));
    }
    if (model.sequence_batching.enabled) {
      return absl::InvalidArgumentError(absl::StrCat(
          DescribeStep(spec, i), " is stateful (sequence_batching); an ensemble's steps are not"));
    }
    for (const auto& [model_output, tensor] : steps[i].outputs) {
      const TensorSpec* declared = FindTensor(model.outputs, model_output);
      if (declared == nullptr || declared->state_only) {
        return absl::InvalidArgumentError(absl::StrCat(DescribeStep(spec, i), ": model '",
                                                       model.name, "' has no output '",
                                                       model_output, "'"));
      }
      known[tensor] = {declared->dtype, declared->dims,
                       absl::StrCat("output '", model_output, "' of step ", i + 1)};
    }
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const ModelSpec& model = *models[i];
    for (const auto& [model_input, tensor] : steps[i].inputs) {
      const TensorSpec* declared = FindTensor(model.inputs, model_input);
      if (declared == nullptr || declared->filled_by_server) {
        return absl::InvalidArgumentError(absl::StrCat(
            DescribeStep(spec, i), ": model '", model.name, "' has no input '", model_input, "'"));
      }
      const Known& from = known.at(tensor);
      if (from.dtype != declared->dtype || !Compatible(from.dims, declared->dims)) {
        return absl::InvalidArgumentError(
            absl::StrCat(DescribeStep(spec, i), ": its input '", model_input, "' is ",
                         Describe(declared->dtype, declared->dims), ", but ensemble tensor '",
                         tensor, "' (", from.from, ") is ", Describe(from.dtype, from.dims)));
      }
    }
    for (const TensorSpec& input : model.inputs) {
      if (input.filled_by_server) continue;
      const bool mapped = std::any_of(steps[i].inputs.begin(), steps[i].inputs.end(),
                                      [&](const auto& each) { return each.first == input.name; });
      if (!mapped) {
        return absl::InvalidArgumentError(absl::StrCat(DescribeStep(spec, i),
                                                       ": its model's input '", input.name,
                                                       "' is not in the step's input_map"));
      }
    }
  }
  for (const TensorSpec& output : spec.outputs) {
    const Known& from = known.at(output.name);
    if (from.dtype != output.dtype || !Compatible(from.dims, output.dims)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ensemble '", spec.name, "': its output '", output.name, "' is declared ",
                       Describe(output.dtype, output.dims), ", but ", from.from, " is ",
                       Describe(from.dtype, from.dims)));
    }
  }
  std::unique_ptr<EnsembleScheduler> scheduler(
      new EnsembleScheduler(std::move(spec), std::move(options)));
  return scheduler;
}

EnsembleScheduler::EnsembleScheduler(ModelSpec spec, Options options)
    : spec_(std::move(spec)), options_(std::move(options)) {
  const std::vector<EnsembleStepSpec>& steps = spec_.ensemble.steps;
  std::map<std::string, size_t> writer;
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const auto& [model_output, tensor] : steps[i].outputs) writer[tensor] = i;
  }
  readers_.resize(steps.size());
  read_by_steps_.resize(steps.size());
  producers_.assign(steps.size(), 0);
  MutexLock lock(&mutex_);
  slots_taken_.assign(steps.size(), 0);
  waiting_.resize(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    std::set<size_t> from;
    for (const auto& [model_input, tensor] : steps[i].inputs) {
      auto it = writer.find(tensor);
      if (it == writer.end()) continue;
      from.insert(it->second);
      for (const auto& [model_output, written] : steps[it->second].outputs) {
        if (written == tensor) read_by_steps_[it->second].insert(model_output);
      }
    }
    producers_[i] = static_cast<int>(from.size());
    for (size_t producer : from) readers_[producer].push_back(i);
  }
}

EnsembleScheduler::~EnsembleScheduler() { Stop(); }

void EnsembleScheduler::Enqueue(std::unique_ptr<InferRequest> request, OutputSink* sink,
                                InferCompletion done) {
  auto run = std::make_shared<Run>();
  run->request = std::move(request);
  run->sink = sink;
  run->done = std::move(done);
  run->started = options_.clock->Now();
  const size_t steps = spec_.ensemble.steps.size();
  for (size_t i = 0; i < steps; ++i)
    run->sinks.push_back(std::make_unique<StepOutputs>(run->copies, &read_by_steps_[i]));
  std::vector<size_t> first;
  {
    MutexLock lock(&run->mutex);
    for (const TensorView& input : run->request->inputs) run->tensors[input.name] = input;
    run->waiting = producers_;
    run->holds.resize(steps);
    run->traces.resize(steps);
    for (size_t i = 0; i < steps; ++i) {
      if (producers_[i] == 0) first.push_back(i);
    }
  }
  {
    // Checked and counted under one lock: Stop waits for every run it let in.
    MutexLock lock(&mutex_);
    if (stopped_) {
      lock.Unlock();
      run->done(absl::UnavailableError(
          absl::StrCat("ensemble '", spec_.name, "' is shutting down; the request did not run")));
      return;
    }
    live_.insert(run);
  }
  if (options_.stats) options_.stats->RecordAdmitted();
  StartSteps(run, std::move(first));
}

void EnsembleScheduler::StartSteps(const std::shared_ptr<Run>& run, std::vector<size_t> steps) {
  for (size_t step : steps) {
    const EnsembleStepSpec& spec = spec_.ensemble.steps[step];
    auto request = std::make_unique<InferRequest>();
    {
      MutexLock lock(&run->mutex);
      if (!run->failure.ok()) return;  // another step failed: start nothing more
      ++run->in_flight;
      request->model_name = spec.model;
      request->id = run->request->id;
      request->protocol = run->request->protocol;
      request->deadline = run->request->deadline;
      request->cancelled = run->cancelled;
      request->parameters.priority = run->request->parameters.priority;
      request->parameters.timeout_us = run->request->parameters.timeout_us;
      for (const auto& [model_input, tensor] : spec.inputs) {
        TensorView view = run->tensors.at(tensor);
        view.name = model_input;
        request->inputs.push_back(std::move(view));
      }
    }
    for (const auto& [model_output, tensor] : spec.outputs)
      request->requested_outputs.push_back(model_output);
    if (run->request->trace) {
      request->trace =
          run->request->trace->StartChild(absl::StrCat("ensemble step ", step + 1), Clock::now());
      request->trace->AddAttribute("sluice.model", spec.model);
      request->trace->AddAttribute("sluice.ensemble", spec_.name);
      request->trace->AddAttribute("sluice.ensemble.step", static_cast<int64_t>(step + 1));
      request->trace->AddAttribute("sluice.batch_size", run->request->batch_size);
      MutexLock lock(&run->mutex);
      run->traces[step] = request->trace;
    }
    // Under max_inflight_requests a step whose model has that many of the step's requests waits
    // here, in order, for one of them to be answered (ReleaseSlot).
    if (spec_.ensemble.max_inflight_requests > 0) {
      MutexLock lock(&mutex_);
      if (slots_taken_[step] >= spec_.ensemble.max_inflight_requests) {
        // Checked under the lock DropCancelledWaiting takes: a run that fails from now on finds
        // this step there.
        if (!run->cancelled->load()) {
          waiting_[step].push_back({run, std::move(request)});
          continue;
        }
        lock.Unlock();
        StepAnswered(run, step, DroppedWhileWaiting(), /*held_slot=*/false);
        continue;
      }
      ++slots_taken_[step];
    }
    SubmitStep(run, step, std::move(request));
  }
}

void EnsembleScheduler::SubmitStep(const std::shared_ptr<Run>& run, size_t step,
                                   std::unique_ptr<InferRequest> request) {
  const EnsembleStepSpec& spec = spec_.ensemble.steps[step];
  StatusOr<InFlightModel> found = options_.lookup->Find(spec.model, spec.VersionText());
  if (!found.ok()) {
    StepAnswered(run, step, found.status());
    return;
  }
  InFlightModel model = *std::move(found);
  model->MarkUsed();  // the memory budget's least-recently-used order counts steps as uses
  if (request->trace) {
    request->trace->AddAttribute("sluice.model_version", model->version());
    request->trace->SetDevice(model->device());
  }
  {
    MutexLock lock(&run->mutex);
    run->holds[step] = model.Another();
  }
  model->Submit(std::move(request), run->sinks[step].get(),
                [this, run, step](Status status) { StepAnswered(run, step, std::move(status)); });
}

void EnsembleScheduler::ReleaseSlot(size_t step) {
  {
    MutexLock lock(&mutex_);
    released_.push_back(step);
    if (handing_on_) return;  // the thread handing slots on takes this one too
    handing_on_ = true;
  }
  // A submit may be answered on this thread (its model unloaded, its queue full, its deadline
  // past) and free its slot again: that slot is queued above and handed on by this loop, so the
  // stack does not grow with the number of waiting steps.
  while (true) {
    std::vector<Waiting> dropped;
    std::optional<Waiting> next;
    size_t freed = 0;
    {
      MutexLock lock(&mutex_);
      if (released_.empty()) {
        handing_on_ = false;
        return;
      }
      freed = released_.front();
      released_.pop_front();
      std::deque<Waiting>& queue = waiting_[freed];
      while (!queue.empty() && !next) {
        Waiting front = std::move(queue.front());
        queue.pop_front();
        if (front.run->cancelled->load()) {
          dropped.push_back(std::move(front));
        } else {
          next = std::move(front);  // the slot passes to it
        }
      }
      if (!next) --slots_taken_[freed];
    }
    for (Waiting& each : dropped) StepAnswered(each.run, freed, DroppedWhileWaiting(), false);
    if (next) SubmitStep(next->run, freed, std::move(next->request));
  }
}

void EnsembleScheduler::DropCancelledWaiting() {
  std::vector<std::pair<size_t, Waiting>> dropped;
  {
    MutexLock lock(&mutex_);
    for (size_t step = 0; step < waiting_.size(); ++step) {
      std::deque<Waiting>& queue = waiting_[step];
      for (auto it = queue.begin(); it != queue.end();) {
        if (it->run->cancelled->load()) {
          dropped.emplace_back(step, std::move(*it));
          it = queue.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  for (auto& [step, each] : dropped) StepAnswered(each.run, step, DroppedWhileWaiting(), false);
}

Status EnsembleScheduler::DroppedWhileWaiting() {
  return absl::CancelledError(
      "the request was cancelled while a step waited for max_inflight_requests");
}

void EnsembleScheduler::StepAnswered(const std::shared_ptr<Run>& run, size_t step, Status status,
                                     bool held_slot) {
  if (held_slot && spec_.ensemble.max_inflight_requests > 0) ReleaseSlot(step);
  std::vector<size_t> ready;
  std::vector<InFlightModel> to_poke;
  InFlightModel hold;  // dropped outside the lock: the last hold may wake an unload
  std::shared_ptr<RequestTrace> trace;
  bool finish = false;
  bool failed_now = false;  // this answer is the run's first failure
  Status answer;
  {
    MutexLock lock(&run->mutex);
    hold = std::move(run->holds[step]);
    trace = std::move(run->traces[step]);
    --run->in_flight;
    if (!status.ok() && run->failure.ok()) {
      const std::string why =
          run->request->IsCancelled()
              ? std::string(status.message())
              : absl::StrCat(DescribeStep(spec_, step), " failed: ", status.message());
      run->failure = Status(status.code(), why);
      failed_now = true;
      // Steps still queued elsewhere are answered at once.
      run->cancelled->store(true);
      for (const InFlightModel& each : run->holds) {
        if (each) to_poke.push_back(each.Another());
      }
    }
    if (status.ok() && run->failure.ok()) {
      ++run->answered;
      const EnsembleStepSpec& spec = spec_.ensemble.steps[step];
      for (TensorView& output : run->sinks[step]->Views()) {
        for (const auto& [model_output, tensor] : spec.outputs) {
          if (model_output != output.name) continue;
          TensorView view = output;
          view.name = tensor;
          run->tensors[tensor] = std::move(view);
        }
      }
      for (size_t reader : readers_[step]) {
        if (--run->waiting[reader] == 0) ready.push_back(reader);
      }
    }
    const bool all = run->answered == spec_.ensemble.steps.size();
    if (run->in_flight == 0 && ready.empty() && !run->finished && (all || !run->failure.ok())) {
      run->finished = true;
      finish = true;
      answer = run->failure;
    }
  }
  if (trace) trace->End(status, Clock::now());  // before the ensemble's own span can end
  for (InFlightModel& each : to_poke) each->Poke();
  if (failed_now && spec_.ensemble.max_inflight_requests > 0) DropCancelledWaiting();
  if (!ready.empty()) StartSteps(run, std::move(ready));
  if (finish) Finish(run, std::move(answer));
}

void EnsembleScheduler::Finish(const std::shared_ptr<Run>& run, Status status) {
  // No step is in flight: the tensors are this thread's to read.
  if (status.ok()) {
    std::vector<const std::string*> wanted;
    if (run->request->requested_outputs.empty()) {
      for (const TensorSpec& output : spec_.outputs) wanted.push_back(&output.name);
    } else {
      for (const std::string& name : run->request->requested_outputs) wanted.push_back(&name);
    }
    // Views of what the steps wrote (their sinks stay until the run goes). The caller's sink is
    // called without the run's lock: a response cache's sink takes single flight's lock, which
    // calls Reschedule (the scheduler's lock, then the run's) while it holds it.
    std::vector<TensorView> outputs;
    {
      MutexLock lock(&run->mutex);
      for (const std::string* name : wanted) outputs.push_back(run->tensors.at(*name));
    }
    for (size_t i = 0; i < wanted.size(); ++i) {
      const std::string* name = wanted[i];
      const TensorView& tensor = outputs[i];
      StatusOr<char*> to = run->sink->Allocate(
          {*name, tensor.dtype, tensor.shape, tensor.byte_size, MemoryType::kCpu});
      if (!to.ok()) {
        status = to.status();
        break;
      }
      // The one copy of an output to the caller: from the host, or from where it is held.
      if (!tensor.held.empty()) {
        status = tensor.held.front().tensor->ReadInto(*to);
        if (!status.ok()) break;
      } else if (tensor.byte_size > 0) {
        std::memcpy(*to, tensor.data, tensor.byte_size);
      }
    }
  }
  const uint64_t on_device = run->copies->on_device.load();
  const uint64_t through_host = run->copies->through_host.load();
  if (options_.stats) options_.stats->RecordEnsembleCopies(on_device, through_host);
  if (run->request->trace) {
    run->request->trace->AddAttribute("sluice.ensemble.copied_on_device_bytes",
                                      static_cast<int64_t>(on_device));
    run->request->trace->AddAttribute("sluice.ensemble.copied_through_host_bytes",
                                      static_cast<int64_t>(through_host));
  }
  const Duration took = options_.clock->Now() - run->started;
  if (options_.stats) {
    if (status.ok()) {
      options_.stats->RecordSuccess(run->request->batch_size, Duration::zero(), Duration::zero(),
                                    took, Duration::zero(), took, run->request->protocol);
    } else {
      options_.stats->RecordFailure(took, status, /*ran=*/true, run->request->protocol);
    }
  }
  if (!status.ok()) {
    spdlog::debug("event=ensemble_failed model={} request_id=\"{}\" reason=\"{}\"", spec_.name,
                  QuoteClientText(run->request->id, 64), std::string(status.message()));
  }
  run->done(std::move(status));
  MutexLock lock(&mutex_);
  live_.erase(run);
  if (live_.empty()) idle_.SignalAll();
}

void EnsembleScheduler::Poke() {
  std::vector<InFlightModel> to_poke;
  {
    MutexLock lock(&mutex_);
    for (const std::shared_ptr<Run>& run : live_) {
      if (!run->request->IsCancelled()) continue;
      run->cancelled->store(true);
      MutexLock run_lock(&run->mutex);
      for (const InFlightModel& each : run->holds) {
        if (each) to_poke.push_back(each.Another());
      }
    }
  }
  for (InFlightModel& each : to_poke) each->Poke();
  if (spec_.ensemble.max_inflight_requests > 0) DropCancelledWaiting();
}

uint64_t EnsembleScheduler::AnswersGeneration() const {
  uint64_t latest = 0;
  for (const EnsembleStepSpec& step : spec_.ensemble.steps)
    latest = std::max(latest, options_.lookup->Generation(step.model));
  return latest;
}

bool EnsembleScheduler::Reschedule(const std::atomic<bool>* tag, int, TimePoint deadline,
                                   TimePoint) {
  MutexLock lock(&mutex_);
  for (const std::shared_ptr<Run>& run : live_) {
    if (run->request->cancelled.get() != tag) continue;
    MutexLock run_lock(&run->mutex);  // StartSteps reads it under it
    if (deadline > run->request->deadline) run->request->deadline = deadline;
    return true;
  }
  return false;
}

void EnsembleScheduler::Stop() {
  MutexLock lock(&mutex_);
  stopped_ = true;
  while (!live_.empty()) idle_.Wait(&mutex_);
}

}  // namespace sluice
