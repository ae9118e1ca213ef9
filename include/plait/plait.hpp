// plait: collective communication, composed at compile time from an algorithm,
// a reduce op and a transport. The one header a program includes for the core;
// transports come from <plait/transport/NAME.hpp>.
#pragma once

#include <plait/algorithm/direct.hpp>
#include <plait/algorithm/ring.hpp>
#include <plait/algorithm/tree.hpp>
#include <plait/collectives.hpp>
#include <plait/communicator.hpp>
#include <plait/error.hpp>
#include <plait/ops.hpp>
#include <plait/options.hpp>
#include <plait/request.hpp>
#include <plait/types.hpp>
