// plait::transport::tcp: links to peers over authenticated TCP sockets.
//
// connect() is collective over `peers` (every rank calls it with the peers it must
// reach; the relation is symmetric) and returns when one authenticated socket to each
// peer is up, or throws: timeout naming the ranks that never connected, auth for a peer
// without the job's token, invalid_argument when peers disagree on slot size or depth.
// Each link keeps its FIFOs in local memory (not zero-copy): a progress thread moves
// posted slots through the socket under credit-based flow control and rings the
// doorbell on every event (see detail/tcp_link_set.hpp for threading and shutdown,
// detail/tcp_wire.hpp for the frames, detail/tcp_connect.hpp for the handshake).
// A peer that dies is reported as peer_lost as soon as its socket reports end-of-stream
// or a reset (within milliseconds on one host; the kernel closes a dead process's sockets).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/error.hpp>
#include <plait/transport.hpp>
#include <plait/transport/detail/tcp_connect.hpp>
#include <plait/transport/detail/tcp_link_set.hpp>

namespace plait::transport {

struct tcp {
  static constexpr transport_traits traits{
      .device_memory = false, .one_sided = false, .zero_copy = false, .network = true, .network_on_one_host = true};
  static constexpr std::string_view name = "tcp";

  // Collective; blocks until every link is up or cfg.connect_timeout passes.
  // `bell` must outlive the returned link set.
  static std::unique_ptr<link_set> connect(bootstrap_context& ctx, plait::detail::doorbell& bell,
                                           const link_config& cfg, std::span<const int> peers) {
    const int rank = ctx.rank();
    const int size = ctx.size();
    if (cfg.slot_bytes == 0 || cfg.slot_bytes > (std::size_t{1} << 31))
      throw error(errc::invalid_argument, "tcp: slot_bytes must be in 1 .. 2^31, got " + std::to_string(cfg.slot_bytes),
                  rank);
    if (cfg.depth == 0 || cfg.depth > 4096)
      throw error(errc::invalid_argument, "tcp: depth must be in 1 .. 4096, got " + std::to_string(cfg.depth), rank);
    if (cfg.connect_timeout <= std::chrono::nanoseconds::zero())
      throw error(errc::invalid_argument, "tcp: connect_timeout must be positive", rank);
    std::vector<bool> seen(static_cast<std::size_t>(size > 0 ? size : 0), false);
    for (int p : peers) {
      if (p < 0 || p >= size || p == rank || seen[static_cast<std::size_t>(p)])
        throw error(errc::invalid_argument,
                    "tcp: peer " + std::to_string(p) + " is out of range, repeated or this rank itself (world of " +
                        std::to_string(size) + ")",
                    rank, p);
      seen[static_cast<std::size_t>(p)] = true;
    }
    auto sockets = tcp_detail::connect_mesh(ctx, cfg, peers);
    return std::make_unique<tcp_detail::tcp_link_set>(rank, size, bell, cfg, std::move(sockets));
  }
};

}  // namespace plait::transport

static_assert(plait::transport_for<plait::transport::tcp>);
