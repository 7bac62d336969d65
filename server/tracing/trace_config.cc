#include "server/tracing/trace_config.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

StatusOr<int64_t> Integer(const std::string& entry, absl::string_view text, int64_t minimum) {
  if (std::optional<int64_t> value = ParseTraceInteger(text, minimum)) return *value;
  return absl::InvalidArgumentError(
      absl::StrCat("--trace-config ", entry, ": the value must be an integer >= ", minimum));
}

}  // namespace

StatusOr<TraceConfig> ParseTraceConfig(const std::vector<std::string>& values) {
  TraceConfig config;
  for (const std::string& entry : values) {
    absl::string_view text = entry;
    std::string section;
    const size_t comma = text.find(',');
    const size_t equals = text.find('=');
    if (comma != absl::string_view::npos && (equals == absl::string_view::npos || comma < equals)) {
      section = std::string(text.substr(0, comma));
      text.remove_prefix(comma + 1);
    }
    const size_t split = text.find('=');
    if (split == absl::string_view::npos || split == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace-config '", entry,
                       "' is not <setting>=<value> or opentelemetry,<setting>=<value>"));
    }
    const std::string key(text.substr(0, split));
    const absl::string_view value = text.substr(split + 1);
    if (section.empty()) {
      if (key == "level") {
        StatusOr<TraceLevel> level = ParseTraceLevel(value);
        if (!level.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--trace-config ", entry, ": ", level.status().message()));
        }
        config.settings.level = *level;
      } else if (key == "rate") {
        SLUICE_ASSIGN_OR_RETURN(config.settings.rate, Integer(entry, value, 1));
      } else if (key == "count") {
        SLUICE_ASSIGN_OR_RETURN(config.settings.count, Integer(entry, value, -1));
      } else if (key == "mode") {
        if (value != "opentelemetry") {
          return absl::InvalidArgumentError(absl::StrCat(
              "--trace-config ", entry,
              ": Sluice's only trace mode is opentelemetry (spans exported over "
              "OTLP/HTTP); Triton's 'triton' mode (JSON trace files) is not supported"));
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--trace-config ", entry, ": unknown setting; use level, rate, count or mode"));
      }
      continue;
    }
    if (section == "triton") {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace-config ", entry,
                       ": Sluice writes no trace files (Triton's 'triton' mode); "
                       "its traces go to an OpenTelemetry collector"));
    }
    if (section != "opentelemetry") {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace-config ", entry, ": unknown section '", section,
                       "'; the exporter's settings are opentelemetry,<setting>=<value>"));
    }
    OtlpHttpExporter::Options& exporter = config.exporter;
    if (key == "url") {
      SLUICE_RETURN_IF_ERROR(ParseOtlpUrl(std::string(value)).status());
      exporter.url = std::string(value);
    } else if (key == "resource") {
      const size_t inner = value.find('=');
      if (inner == absl::string_view::npos || inner == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--trace-config ", entry,
                         ": a resource attribute is key=value, e.g. service.name=sluice"));
      }
      exporter.resource.emplace_back(std::string(value.substr(0, inner)),
                                     std::string(value.substr(inner + 1)));
    } else if (key == "bsp_max_queue_size") {
      SLUICE_ASSIGN_OR_RETURN(int64_t size, Integer(entry, value, 1));
      exporter.max_queue_size = static_cast<size_t>(size);
    } else if (key == "bsp_schedule_delay") {
      SLUICE_ASSIGN_OR_RETURN(int64_t delay, Integer(entry, value, 1));
      if (delay >
          std::chrono::duration_cast<std::chrono::milliseconds>(kMaxScheduleDelay).count()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--trace-config ", entry, ": at most one day (86400000 ms)"));
      }
      exporter.schedule_delay = std::chrono::milliseconds(delay);
    } else if (key == "bsp_max_export_batch_size") {
      SLUICE_ASSIGN_OR_RETURN(int64_t size, Integer(entry, value, 1));
      exporter.max_export_batch_size = static_cast<size_t>(size);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace-config ", entry,
                       ": unknown OpenTelemetry setting; use url, resource, "
                       "bsp_max_queue_size, bsp_schedule_delay or bsp_max_export_batch_size"));
    }
  }
  if (config.exporter.max_export_batch_size > config.exporter.max_queue_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trace-config: bsp_max_export_batch_size (", config.exporter.max_export_batch_size,
        ") must not exceed bsp_max_queue_size (", config.exporter.max_queue_size, ")"));
  }
  return config;
}

}  // namespace sluice
