// plait::call_options: the optional last argument of every call (DESIGN.md section 4).
// An aggregate whose fields all have defaults, so `call_options{.timeout = 3s}` reads well
// and new fields can be added without breaking callers.
#pragma once

#include <chrono>

namespace plait {

struct call_options {
  // 0 = the communicator's timeout (PLAIT_TIMEOUT, default 600 s, or set_timeout()).
  std::chrono::milliseconds timeout{0};
};

}  // namespace plait
