#include "server/core/runtime_log.h"

#include "server/core/logging.h"

namespace sluice {

void LogRuntimeInfo(const std::string& line) { spdlog::info("{}", line); }
void LogRuntimeWarning(const std::string& line) { spdlog::warn("{}", line); }

}  // namespace sluice
