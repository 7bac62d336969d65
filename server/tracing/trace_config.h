// --trace-config, as Triton spells it: "<setting>=<value>" for the trace settings, and
// "opentelemetry,<setting>=<value>" for the exporter's. Values given later win; resource
// attributes add up.
//   level=OFF|TIMESTAMPS     rate=N (>= 1, default 1000)     count=N (>= -1, default -1)
//   mode=opentelemetry       (Triton's other mode, "triton", writes JSON trace files: refused)
//   opentelemetry,url=http://host:port/path        (default http://localhost:4318/v1/traces)
//   opentelemetry,resource=key=value               (repeatable; service.name=sluice by default)
//   opentelemetry,bsp_max_queue_size=N             (default 2048)
//   opentelemetry,bsp_schedule_delay=MS            (default 5000)
//   opentelemetry,bsp_max_export_batch_size=N      (default 512)
#pragma once

#include <string>
#include <vector>

#include "server/core/status.h"
#include "server/tracing/otlp_exporter.h"
#include "server/tracing/tracer.h"

namespace sluice {

struct TraceConfig {
  TraceSettings settings;
  OtlpHttpExporter::Options exporter;
};

// INVALID_ARGUMENT naming the value that is wrong and what is expected.
StatusOr<TraceConfig> ParseTraceConfig(const std::vector<std::string>& values);

}  // namespace sluice
