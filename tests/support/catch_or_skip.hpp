// The main() of a test executable whose cases need something this host may lack:
// where `missing` says what (non-empty), it prints the reason and exits 77, Meson's
// SKIP; otherwise it runs the cases. Include after <catch2/catch.hpp> with
// CATCH_CONFIG_RUNNER defined.
#pragma once

#include <cstdio>
#include <string>

namespace plait::testing {

inline int catch_or_skip(const std::string& missing, int argc, char** argv) {
  if (!missing.empty()) {
    std::printf("SKIP: %s\n", missing.c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

}  // namespace plait::testing
