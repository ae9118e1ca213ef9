// plait::communicator<Transport>: a group of ranks connected by one transport.
//
// Movable, not copyable. from_env() joins the job the environment describes
// (DESIGN.md section 5: plaitrun, by hand, mpirun/srun, torchrun; none = a world of
// one) and connects every pair of ranks through Transport. create() does the same
// from a bootstrap_context of the caller's (a custom rendezvous). Calls on one
// communicator come from one thread at a time and complete in issue order; abort()
// may be called from any thread. The destructor closes every link and never throws.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <plait/bootstrap/store_context.hpp>
#include <plait/detail/comm_core.hpp>
#include <plait/detail/env.hpp>
#include <plait/detail/socket.hpp>
#include <plait/transport.hpp>

namespace plait {

namespace detail {

// PLAIT_TCP_CONGESTION's algorithm, once this kernel has taken it on a socket of this
// process: a name it refuses is invalid_argument at start-up, on every rank that sets
// it, before any link is made.
inline std::string congestion_this_kernel_takes(std::string_view name) {
  const std::string n(name);
  const fd_handle probe(::socket(AF_INET, SOCK_STREAM, 0));
  const int refused = probe.get() < 0 ? errno : set_congestion(probe.get(), n);
  if (refused == 0) return n;
  throw error(errc::invalid_argument,
              "PLAIT_TCP_CONGESTION=" + n + ": the kernel refuses it (" + errno_text(refused) +
                  "); use `system`, or a name in net.ipv4.tcp_allowed_congestion_control (any in "
                  "net.ipv4.tcp_available_congestion_control with CAP_NET_ADMIN)");
}

// Environment knobs, parsed strictly (a malformed value is invalid_argument).
inline comm_config config_from_env() {
  comm_config cfg;
  if (auto t = env_seconds("PLAIT_TIMEOUT")) cfg.timeout = *t;
  if (auto b = env_bytes("PLAIT_SLICE_BYTES")) {
    if (*b < 64 || *b > (std::size_t{64} << 20))
      throw error(errc::invalid_argument,
                  "PLAIT_SLICE_BYTES=" + std::to_string(*b) + " is out of range: use 64 bytes to 64M");
    cfg.slice_bytes = *b;
  }
  if (auto b = env_bytes("PLAIT_COPY_SLICE_BYTES")) {
    if (*b < 64 || *b > (std::size_t{64} << 20))
      throw error(errc::invalid_argument,
                  "PLAIT_COPY_SLICE_BYTES=" + std::to_string(*b) + " is out of range: use 64 bytes to 64M");
    cfg.copy_slice_bytes = *b;
  }
  if (auto d = env_bytes("PLAIT_DEPTH")) {
    if (*d < 1 || *d > 64)
      throw error(errc::invalid_argument, "PLAIT_DEPTH=" + std::to_string(*d) + " is out of range: use 1 to 64 slots");
    cfg.depth = *d;
  }
  if (auto w = env_bytes("PLAIT_SEND_WINDOW")) {
    if (*w < 1 || *w > 64)
      throw error(errc::invalid_argument,
                  "PLAIT_SEND_WINDOW=" + std::to_string(*w) + " is out of range: use 1 to 64 slots");
    cfg.send_window = *w;
  }
  if (auto t = env_seconds("PLAIT_POLL")) {
    if (*t > std::chrono::seconds(1))
      throw error(errc::invalid_argument, "PLAIT_POLL is out of range: use 0 to 1 second");
    cfg.poll = *t;
  }
  if (const char* v = std::getenv("PLAIT_PROGRESS")) {
    const std::string_view s(v);
    if (s == "caller")
      cfg.waiter_io = true;
    else if (s == "thread")
      cfg.waiter_io = false;
    else
      throw bad_env("PLAIT_PROGRESS", s, "caller or thread");
  }
  if (const char* v = std::getenv("PLAIT_SINGLE_COPY")) {
    const std::string_view s(v);
    if (s == "on" || s == "always")
      cfg.single_copy = true;
    else if (s == "off")
      cfg.single_copy = false;
    else
      throw bad_env("PLAIT_SINGLE_COPY", s, "on, off or always");
    cfg.lend_always = s == "always";
  }
  if (const char* v = std::getenv("PLAIT_HUGE_PAGES")) {
    const std::string_view s(v);
    if (s != "on" && s != "off") throw bad_env("PLAIT_HUGE_PAGES", s, "on or off");
    cfg.huge_pages = s == "on";
  }
  if (const char* v = std::getenv("PLAIT_TCP_CONGESTION")) {
    const std::string_view s(v);
    if (s == "system")
      cfg.host_congestion.emplace();
    else
      cfg.host_congestion = congestion_this_kernel_takes(s);
  }
  if (const char* v = std::getenv("PLAIT_CHAIN")) {
    const std::string_view s(v);
    if (s != "cpus" && s != "ranks") throw bad_env("PLAIT_CHAIN", s, "cpus or ranks");
    cfg.chain_by_cpu = s == "cpus";
  }
  if (const char* v = std::getenv("PLAIT_STREAM_BYTES")) {
    if (std::string_view(v) == "off")
      cfg.stream_from_bytes = std::numeric_limits<std::size_t>::max();
    else if (auto b = env_bytes("PLAIT_STREAM_BYTES"); *b == 0)
      throw error(errc::invalid_argument,
                  "PLAIT_STREAM_BYTES=0 is out of range: use an output size of 1 byte or more, or off");
    else
      cfg.stream_from_bytes = *b;
    cfg.broadcast_stream_from_bytes = cfg.stream_from_bytes;
  }
  return cfg;
}

}  // namespace detail

template <transport_for Transport>
class communicator {
 public:
  using transport_type = Transport;

  // Joins the job described by the environment (DESIGN.md section 5).
  static communicator from_env() {
    auto cfg = detail::config_from_env();
    const auto deadline = clock::now() + cfg.timeout;
    auto world = std::make_shared<bootstrap::world>(bootstrap::join_world(deadline));
    if (world->info.size == 1) {
      resolve_slices(cfg, 1, false);
      resolve_depth(cfg, false);
      communicator c(std::make_unique<detail::comm_core>(0, 1, cfg));
      return c;
    }
    auto ctx = bootstrap::make_context(*world, next_scope());
    return create(std::move(ctx), cfg, world);
  }

  // Connects the ranks of `ctx` (every rank calls it, each with its own context).
  static communicator create(std::unique_ptr<bootstrap_context> ctx, detail::comm_config cfg = {},
                             std::shared_ptr<void> keepalive = {}) {
    const int rank = ctx->rank(), size = ctx->size();
    const auto deadline = clock::now() + cfg.timeout;
    join(*ctx, deadline);
    agree_on_config(*ctx, cfg, deadline);
    cfg.network = Transport::traits.network;
    if (cfg.network && size > 1) {
      agree_on_placement(*ctx, cfg, deadline);
      if (cfg.one_host && !Transport::traits.network_on_one_host) {
        cfg.network = false;  // a hybrid on one host: all local
        cfg.chain.clear();    // (measured over tcp only)
        cfg.shared_cpus = false;
      }
    }
    if (!Transport::traits.network && size > 1 && cfg.cpu_ring.empty()) {
      // The same placement record; over a memory transport only its chain is kept,
      // for the ring's reductions (comm_config::ring_follows_cpus), and a chain the
      // caller gave stays as it was.
      std::vector<int> given = std::move(cfg.chain);
      agree_on_placement(*ctx, cfg, deadline);
      cfg.cpu_ring = std::move(cfg.chain);
      cfg.chain = std::move(given);
      cfg.one_host = false;
      cfg.shared_cpus = false;
    }
    cfg.shares_copies = Transport::traits.shares_copies && !cfg.network;
    resolve_slices(cfg, size, cfg.network && cfg.one_host);
    resolve_depth(cfg, cfg.network && cfg.one_host);
    if (!cfg.host_congestion) cfg.host_congestion = detail::comm_config::host_congestion_for(size);
    auto core = std::make_unique<detail::comm_core>(rank, size, cfg);
    if (size > 1) {
      std::vector<int> peers;
      for (int p = 0; p < size; ++p)
        if (p != rank) peers.push_back(p);
      link_config lc;
      lc.slot_bytes = cfg.slot_bytes();
      lc.depth = cfg.depth;
      // The window in frames of the smallest slice, and as many of a larger one: each
      // kind of call keeps send_window full frames in flight.
      lc.send_window_bytes = cfg.send_window * std::min(cfg.slice_bytes, cfg.copy_slice_bytes);
      lc.send_window_frames = cfg.send_window;
      lc.connect_timeout = cfg.timeout;
      lc.single_copy = cfg.single_copy;
      lc.host_congestion = *cfg.host_congestion;
      auto links = Transport::connect(*ctx, core->bell(), lc, std::span<const int>(peers));
      ctx->barrier("connected", deadline);
      core->attach(std::move(links), std::move(ctx), std::move(keepalive));
    }
    return communicator(std::move(core));
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() = default;

  int rank() const noexcept { return core_->rank(); }
  int size() const noexcept { return core_->size(); }
  // The pipeline slice size and FIFO depth every rank agreed on at start-up; plain
  // copies (broadcast, send/recv) go in slices of copy_slice_bytes(), an all_gather
  // in gather_slice_bytes() for an output of that many bytes (by default, of any size
  // from 2 MiB up over tcp; over shm, 2 ranks with a core each, 1 to 8 MiB), and a
  // slot holds the largest.
  std::size_t slice_bytes() const noexcept { return core_->config().slice_bytes; }
  std::size_t copy_slice_bytes() const noexcept { return core_->config().copy_slice_bytes; }
  std::size_t gather_slice_bytes(std::size_t output_bytes = std::numeric_limits<std::size_t>::max()) const noexcept {
    return core_->config().slice_for(detail::collective_kind::all_gather, output_bytes);
  }
  std::size_t pipeline_depth() const noexcept { return core_->config().depth; }
  // Full frames a link may send ahead of the peer's credits (at most
  // pipeline_depth(); PLAIT_SEND_WINDOW).
  std::size_t send_window() const noexcept { return core_->config().send_window; }

  template <class Rep, class Period>
  void set_timeout(std::chrono::duration<Rep, Period> t) {
    if (t <= std::chrono::duration<Rep, Period>::zero())
      throw error(errc::invalid_argument, "set_timeout needs a positive duration", rank());
    core_->set_timeout(std::chrono::duration_cast<std::chrono::nanoseconds>(t));
  }

  // Makes every pending and later call fail with errc::aborted; closes the links.
  void abort() noexcept { core_->abort(); }

  detail::comm_core& core() noexcept { return *core_; }

 private:
  explicit communicator(std::unique_ptr<detail::comm_core> core) : core_(std::move(core)) {}

  // Each process makes its communicators in the same order, so a per-process
  // counter names the same communicator on every rank.
  static std::string next_scope() {
    static std::atomic<int> counter{0};
    return "c" + std::to_string(counter.fetch_add(1)) + "/";
  }

  // Every rank checks in first, so a rank that never starts is named by the others.
  static void join(bootstrap_context& ctx, clock::time_point deadline) {
    if (ctx.size() == 1) return;
    const std::byte here{1};
    ctx.put("joined/" + std::to_string(ctx.rank()), std::span(&here, 1));
    try {
      ctx.barrier("joined", deadline);
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw;
      for (int p = 0; p < ctx.size(); ++p) {
        bool present = true;
        try {
          present = ctx.try_get("joined/" + std::to_string(p)).has_value();
        } catch (const error&) {
        }
        if (!present)
          throw error(errc::timeout,
                      "rank " + std::to_string(p) + " never joined the communicator before the deadline (" +
                          e.message() + "); did it start, and with the same PLAIT_STORE?",
                      ctx.rank(), p);
      }
      throw;
    }
  }

  // The slices left unset (0). The slice: slice_default. The copy slice: the slice
  // over a network transport, at least copy_slice_default on memory transports. With
  // the slice unset, over a network transport with every rank on one host and a core
  // per rank, all_gather's frames are network_gather_slice_core_per_rank (fewer frames,
  // credits and wake-ups per byte; a reducing step keeps the slice, whose slot, input
  // and output stay in a core's L2: docs/performance.md, "TCP on one host: all_gather
  // in 512 KiB slices with a core per rank"). With the slice unset and ranks sharing
  // the CPUs they are bound to (cfg.shared_cpus), a reducing step and an all_gather
  // under network_gather_small_below_bytes take network_slice_shared_cpus, and the
  // copies and larger all_gathers keep slice_default ("TCP, ranks sharing bound CPUs:
  // reducing slices of 128 KiB", "... all_gather under 2 MiB in 128 KiB slices"). With
  // the slice unset over a memory transport, 2 ranks with a core each, an all_gather of
  // 1 to 8 MiB of output takes memory_gather_slice_two_ranks ("shm all_gather of 1 to
  // 8 MiB in 512 KiB slices"; more ranks with a core each were not measured).
  static void resolve_slices(detail::comm_config& cfg, int size, bool network_on_one_host) noexcept {
    using detail::comm_config;
    const bool slice_set = cfg.slice_bytes != 0;
    if (!slice_set) {
      cfg.slice_bytes = comm_config::slice_default;
      if (!cfg.network && size == 2 && !detail::more_ranks_than_cores(size))
        cfg.gather_slice_bytes = comm_config::memory_gather_slice_two_ranks;
      if (network_on_one_host && !detail::more_ranks_than_cores(size))
        cfg.gather_slice_bytes = comm_config::network_gather_slice_core_per_rank;
      if (network_on_one_host && cfg.shared_cpus) {
        cfg.slice_bytes = comm_config::network_slice_shared_cpus;
        cfg.gather_slice_bytes = comm_config::slice_default;
        cfg.gather_small_slice_bytes = comm_config::network_slice_shared_cpus;
        if (cfg.copy_slice_bytes == 0) cfg.copy_slice_bytes = comm_config::slice_default;
      }
    }
    if (cfg.copy_slice_bytes == 0)
      cfg.copy_slice_bytes = cfg.network ? cfg.slice_bytes : std::max(cfg.slice_bytes, comm_config::copy_slice_default);
  }

  // The depth and send window left unset (0): default_depth, and a window of
  // network_window_on_one_host slots over a network transport on one host, else the
  // depth; a window is never more than the depth.
  static void resolve_depth(detail::comm_config& cfg, bool network_on_one_host) noexcept {
    if (cfg.depth == 0) cfg.depth = detail::comm_config::default_depth;
    if (cfg.send_window == 0)
      cfg.send_window = network_on_one_host ? detail::comm_config::network_window_on_one_host : cfg.depth;
    cfg.send_window = std::min(cfg.send_window, cfg.depth);
  }

  // Rank 0's slice sizes, depth and send window are everyone's (slots must be the same
  // size; the window is one rule for the whole job).
  static void agree_on_config(bootstrap_context& ctx, detail::comm_config& cfg, clock::time_point deadline) {
    if (ctx.size() == 1) return;
    std::uint64_t v[4] = {cfg.slice_bytes, cfg.depth, cfg.copy_slice_bytes, cfg.send_window};
    if (ctx.rank() == 0) {
      ctx.put("config", std::as_bytes(std::span(v)));
    } else {
      auto got = ctx.get("config", deadline);
      if (got.size() != sizeof v) throw error(errc::protocol, "malformed config record from rank 0", ctx.rank(), 0);
      std::memcpy(v, got.data(), sizeof v);
      cfg.slice_bytes = static_cast<std::size_t>(v[0]);
      cfg.depth = static_cast<std::size_t>(v[1]);
      cfg.copy_slice_bytes = static_cast<std::size_t>(v[2]);
      cfg.send_window = static_cast<std::size_t>(v[3]);
    }
  }

  // Whether every rank has this rank's host identity (cfg.one_host) and, on one host,
  // whether the ranks share the CPUs they are bound to (cfg.shared_cpus) and the chain
  // that keeps them together (cfg.chain): rank 0 reads each rank's CPU and host
  // identity and tells the rest (one record per rank, n - 1 reads on rank 0, one on the
  // others). The verdict record is one byte (bit 0: one host; bit 1: shared CPUs),
  // then the chain, n ranks as 4-byte integers, or nothing.
  static void agree_on_placement(bootstrap_context& ctx, detail::comm_config& cfg, clock::time_point deadline) {
    const std::string me = ctx.host_id();
    const int n = ctx.size();
    auto chain_from = [&](std::span<const std::byte> rec) {
      if (rec.size() != 1 && rec.size() != 1 + 4 * static_cast<std::size_t>(n))
        throw error(errc::protocol, "malformed one-host record from rank 0", ctx.rank(), 0);
      if ((rec[0] & ~std::byte{3}) != std::byte{0})
        throw error(errc::protocol, "malformed one-host record from rank 0", ctx.rank(), 0);
      cfg.one_host = (rec[0] & std::byte{1}) != std::byte{0};
      cfg.shared_cpus = (rec[0] & std::byte{2}) != std::byte{0};
      cfg.chain.assign(rec.size() > 1 ? static_cast<std::size_t>(n) : 0, 0);
      for (std::size_t i = 0; i < cfg.chain.size(); ++i) {
        std::int32_t r;
        std::memcpy(&r, rec.data() + 1 + 4 * i, 4);
        cfg.chain[i] = r;
      }
    };
    if (ctx.rank() != 0) {
      std::string rec(4, '\0');
      const std::int32_t cpu = detail::bound_cpu();
      std::memcpy(rec.data(), &cpu, 4);
      rec += me;
      ctx.put("place/" + std::to_string(ctx.rank()), std::as_bytes(std::span(rec.data(), rec.size())));
      chain_from(ctx.get("one-host", deadline));
      return;
    }
    bool same = true;
    std::vector<int> cpu(static_cast<std::size_t>(n), -1);
    cpu[0] = detail::bound_cpu();
    for (int p = 1; p < n; ++p) {
      auto got = ctx.get("place/" + std::to_string(p), deadline);
      if (got.size() < 4)
        throw error(errc::protocol, "malformed placement record from rank " + std::to_string(p), 0, p);
      std::int32_t c;
      std::memcpy(&c, got.data(), 4);
      cpu[static_cast<std::size_t>(p)] = c;
      same = same && std::string_view(reinterpret_cast<const char*>(got.data()) + 4, got.size() - 4) == me;
    }
    // Shared where every rank is bound to one CPU and some CPU has two or more; grouped
    // by CPU then, unless PLAIT_CHAIN says rank order.
    std::vector<int> by_cpu = cpu;
    std::sort(by_cpu.begin(), by_cpu.end());
    const bool shared = same && by_cpu.front() >= 0 && std::adjacent_find(by_cpu.begin(), by_cpu.end()) != by_cpu.end();
    const bool grouped = shared && cfg.chain_by_cpu;
    std::vector<std::byte> rec(1, std::byte{static_cast<unsigned char>((same ? 1 : 0) | (shared ? 2 : 0))});
    if (grouped) {
      std::vector<int> chain(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) chain[static_cast<std::size_t>(r)] = r;
      std::stable_sort(chain.begin(), chain.end(), [&](int a, int b) {
        return cpu[static_cast<std::size_t>(a)] < cpu[static_cast<std::size_t>(b)];
      });
      for (const std::int32_t r : chain) {
        const auto* b = reinterpret_cast<const std::byte*>(&r);
        rec.insert(rec.end(), b, b + 4);
      }
    }
    ctx.put("one-host", rec);
    chain_from(rec);
  }

  std::unique_ptr<detail::comm_core> core_;
};

}  // namespace plait
