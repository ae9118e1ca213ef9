// The bootstrap key-value store: server, client and their wire format.
// See store_server.hpp, store_client.hpp and store_protocol.hpp for the contracts.
#pragma once

#include <plait/bootstrap/store_client.hpp>
#include <plait/bootstrap/store_protocol.hpp>
#include <plait/bootstrap/store_server.hpp>
