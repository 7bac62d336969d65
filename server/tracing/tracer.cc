#include "server/tracing/tracer.h"

#include <charconv>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/message_text.h"

namespace sluice {
namespace {

const TimeSource& SteadyClock() {
  static const SteadyTimeSource clock;
  return clock;
}

StatusOr<int64_t> ParseInteger(const std::string& key, const std::string& text, int64_t minimum) {
  if (std::optional<int64_t> value = ParseTraceInteger(text, minimum)) return *value;
  return absl::InvalidArgumentError(absl::StrCat("trace setting '", key, "' must be an integer >= ",
                                                 minimum, ", not '", QuoteClientText(text), "'"));
}

StatusOr<TraceLevel> ParseLevels(const std::vector<std::string>& values) {
  // Triton's levels are a list (TIMESTAMPS and TENSORS may both be on); OFF alone turns it off.
  TraceLevel level = TraceLevel::kOff;
  for (const std::string& value : values) {
    SLUICE_ASSIGN_OR_RETURN(TraceLevel each, ParseTraceLevel(value));
    if (each != TraceLevel::kOff) level = each;
  }
  return level;
}

const std::string& OneValue(const std::vector<std::string>& values) { return values.front(); }

}  // namespace

const char* TraceLevelName(TraceLevel level) {
  return level == TraceLevel::kTimestamps ? "TIMESTAMPS" : "OFF";
}

StatusOr<TraceLevel> ParseTraceLevel(absl::string_view name) {
  if (name == "OFF") return TraceLevel::kOff;
  if (name == "TIMESTAMPS") return TraceLevel::kTimestamps;
  if (name == "TENSORS") {
    return absl::InvalidArgumentError(
        "trace level TENSORS is not supported: Sluice traces timings (TIMESTAMPS), not tensor "
        "contents");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown trace level '", QuoteClientText(name), "'; use OFF or TIMESTAMPS"));
}

std::optional<int64_t> ParseTraceInteger(absl::string_view text, int64_t minimum) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < minimum)
    return std::nullopt;
  return value;
}

Tracer::Tracer(Options options)
    : options_(std::move(options)),
      unix_offset_(std::chrono::duration_cast<Duration>(
                       std::chrono::system_clock::now().time_since_epoch()) -
                   Clock::now().time_since_epoch()),
      global_(options_.settings),
      global_remaining_(options_.settings.count) {
  MutexLock lock(&mutex_);
  Recount();
}

void Tracer::Recount() {
  bool on = global_.level != TraceLevel::kOff;
  for (const auto& [name, model] : models_) on |= Effective(&model).level != TraceLevel::kOff;
  active_.store(on, std::memory_order_relaxed);
}

TraceSettings Tracer::Effective(const ModelSettings* model) const {
  TraceSettings settings = global_;
  if (model == nullptr) return settings;
  if (model->level) settings.level = *model->level;
  if (model->rate) settings.rate = *model->rate;
  if (model->count) settings.count = *model->count;
  return settings;
}

std::shared_ptr<RequestTrace> Tracer::Start(
    const std::string& model, absl::FunctionRef<absl::string_view(const char*)> header,
    std::string span_name) {
  if (!active()) return nullptr;
  std::optional<SpanContext> parent = ParseTraceparent(header("traceparent"), header("tracestate"));
  // The caller decided not to record this trace: neither does Sluice (OpenTelemetry's
  // parent-based sampling), so that a backend never holds Sluice's half of a trace.
  if (parent && (parent->flags & kSampledFlag) == 0) return nullptr;
  {
    MutexLock lock(&mutex_);
    auto found = models_.find(model);
    ModelSettings* own = found == models_.end() ? nullptr : &found->second;
    const TraceSettings settings = Effective(own);
    if (settings.level == TraceLevel::kOff) return nullptr;
    if (!parent) {
      // One request in `rate`, the first of each `rate` included, while the count lasts.
      int64_t& remaining = own != nullptr ? own->remaining : global_remaining_;
      uint64_t& seen = own != nullptr ? own->seen : global_seen_;
      if (remaining == 0) return nullptr;
      if (seen++ % static_cast<uint64_t>(settings.rate) != 0) return nullptr;
      if (remaining > 0) --remaining;
    }
  }
  const TimeSource& clock = options_.clock != nullptr ? *options_.clock : SteadyClock();
  return std::make_shared<RequestTrace>(options_.sink, unix_offset_, std::move(parent),
                                        std::move(span_name), clock.Now());
}

TraceSettingsMap Tracer::ToMap(const TraceSettings& settings) const {
  return {{"trace_level", {TraceLevelName(settings.level)}},
          {"trace_rate", {std::to_string(settings.rate)}},
          {"trace_count", {std::to_string(settings.count)}},
          {"log_frequency", {"0"}},
          {"trace_mode", {"opentelemetry"}}};
}

TraceSettingsMap Tracer::Get(const std::string& model) const {
  MutexLock lock(&mutex_);
  auto found = models_.find(model);
  TraceSettings settings = Effective(found == models_.end() ? nullptr : &found->second);
  // The count shown is what is left of it.
  settings.count = found != models_.end() ? found->second.remaining : global_remaining_;
  return ToMap(settings);
}

StatusOr<TraceSettingsMap> Tracer::Update(const std::string& model,
                                          const TraceSettingsMap& update) {
  // Checked in full before anything changes.
  std::optional<std::optional<TraceLevel>>
      level;  // outer: the key was given; inner nullopt: cleared
  std::optional<std::optional<int64_t>> rate, count;
  for (const auto& [key, values] : update) {
    const bool clear = values.empty();
    if (key == "trace_level") {
      if (clear) {
        level.emplace();
      } else {
        SLUICE_ASSIGN_OR_RETURN(TraceLevel parsed, ParseLevels(values));
        level.emplace(parsed);
      }
    } else if (key == "trace_rate" || key == "trace_count") {
      auto& target = key == "trace_rate" ? rate : count;
      if (clear) {
        target.emplace();
        continue;
      }
      if (values.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("trace setting '", key, "' takes one value, not ", values.size(), " (",
                         QuoteClientText(absl::StrJoin(values, ", ")), ")"));
      }
      SLUICE_ASSIGN_OR_RETURN(int64_t parsed,
                              ParseInteger(key, OneValue(values), key == "trace_rate" ? 1 : -1));
      target.emplace(parsed);
    } else if (key == "log_frequency") {
      // Triton's trace files roll over every log_frequency traces; Sluice writes no trace files.
      if (!clear && !(values.size() == 1 && OneValue(values) == "0")) {
        return absl::InvalidArgumentError(
            "trace setting 'log_frequency' can only be 0: Sluice exports spans over OTLP and "
            "writes no trace files");
      }
    } else if (key == "trace_file" || key == "trace_mode") {
      return absl::InvalidArgumentError(absl::StrCat(
          "trace setting '", key,
          "' cannot be changed at run time: Sluice exports OpenTelemetry spans to the ",
          "collector set at start-up (--trace-config opentelemetry,url=...)"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown trace setting '",
                                                     QuoteClientText(key),
                                                     "'; the settings are trace_level, trace_rate, "
                                                     "trace_count, log_frequency and trace_mode"));
    }
  }
  MutexLock lock(&mutex_);
  if (model.empty()) {
    if (level) global_.level = level->value_or(options_.settings.level);
    if (rate) {
      global_.rate = rate->value_or(options_.settings.rate);
      global_seen_ = 0;
    }
    if (count) {
      global_.count = count->value_or(options_.settings.count);
      global_remaining_ = global_.count;
    }
  } else {
    auto [entry, made] = models_.try_emplace(model);
    ModelSettings& own = entry->second;
    if (level) own.level = *level;
    if (rate) {
      own.rate = *rate;
      own.seen = 0;
    }
    if (count) own.count = *count;
    if (made || count) own.remaining = Effective(&own).count;
    if (!own.level && !own.rate && !own.count)
      models_.erase(entry);  // all cleared: the server's again
  }
  Recount();
  lock.Unlock();
  return Get(model);
}

}  // namespace sluice
