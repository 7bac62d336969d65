// An operator library for the tests that needs a symbol nothing provides: it does not load
// (dlopen's "undefined symbol"), and the server refuses it with that reason.
extern "C" void sluice_test_symbol_nobody_defines();

extern "C" __attribute__((visibility("default"))) void sluice_test_unresolved() {
  sluice_test_symbol_nobody_defines();
}
