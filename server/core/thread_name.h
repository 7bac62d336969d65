// Names the calling thread, as `top -H`, `ps -L`, gdb and `perf report --sort comm` show it.
#pragma once

#include <string>

namespace sluice {

// Linux keeps 15 characters of a thread name: longer names are cut. Best effort: a failure
// leaves the name as it was.
void NameThisThread(const std::string& name);

}  // namespace sluice
