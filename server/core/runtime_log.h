// Log lines for server/runtime, which cannot include spdlog (the torch wheel's fmt headers clash
// with the system fmt that spdlog is built against): the runtime composes the line (Sluice's
// `event=name key=value ...` convention, see logging.h) and this writes it through spdlog.
#pragma once

#include <string>

namespace sluice {

void LogRuntimeInfo(const std::string& line);
void LogRuntimeWarning(const std::string& line);

}  // namespace sluice
