// comm_core: everything a communicator is, except its transport type.
//
// Kept non-templated so that the executor, the async machinery and error handling
// are compiled once per program, not once per transport. Owns the links, the
// doorbell, the sequence counters, the broken state and the progress thread that
// drives async collectives.
// Threading: calls come from one user thread at a time. Every call joins a list of
// calls in flight, advanced in issue order by whoever drives: a blocking call drives
// on the caller's thread (no hand-off on the latency path), async calls are driven by
// one progress thread; each pair's slots stay in issue order (executor::advance).
// abort() may come from any thread. After the first error every call in flight fails
// and every later call rethrows it (the communicator is broken).
#pragma once

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/detail/huge_backing.hpp>
#include <plait/error.hpp>
#include <plait/executor.hpp>
#include <plait/request.hpp>
#include <plait/transport.hpp>

namespace plait::detail {

// A first-in, first-out list that keeps its memory: std::deque allocates a block every
// few dozen pushes even when it never holds more than one element, and the calls in
// flight pass through one such list per call (no allocation on the hot path, issue 4).
template <class T>
class fifo_list {
 public:
  bool empty() const noexcept { return head_ == items_.size(); }
  T& front() noexcept { return items_[head_]; }
  auto begin() noexcept { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  auto end() noexcept { return items_.end(); }
  void push_back(T v) {
    if (head_ > 0 && items_.size() == items_.capacity()) {  // reuse the room the front left
      items_.erase(items_.begin(), begin());
      head_ = 0;
    }
    items_.push_back(std::move(v));
  }
  void pop_front() noexcept {
    items_[head_++] = T{};
    if (empty()) clear();
  }
  void clear() noexcept {
    items_.clear();
    head_ = 0;
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0;  // items_[0, head_) are popped
};

// More ranks than this host has cores (likely: every rank is taken to be on this host).
// The one CPU this thread may run on, or -1 when it may run on several (or the
// kernel does not say).
inline int bound_cpu() noexcept {
  cpu_set_t s;
  if (::sched_getaffinity(0, sizeof s, &s) != 0 || CPU_COUNT(&s) != 1) return -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &s)) return c;
  return -1;
}

inline bool more_ranks_than_cores(int ranks) noexcept {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores != 0 && static_cast<unsigned>(ranks) > cores;
}

// The bytes of the last-level cache of the CPU this runs on, as Linux describes it in
// sysfs (what lscpu shows); 0 where it does not say. Not sysconf(_SC_LEVEL3_CACHE_SIZE):
// glibc reads that from the CPU's own description, which said 320 MiB on a host type
// here whose L3 is 32 MiB.
inline std::size_t last_level_cache_bytes() noexcept {
  std::size_t bytes = 0;
  unsigned top = 0;
  for (int i = 0; i < 16; ++i) {
    char path[96];
    const auto read = [&](const char* name, char* buf, std::size_t n) {
      std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, name);
      std::FILE* f = std::fopen(path, "r");
      if (f == nullptr) return false;
      const bool got = std::fgets(buf, static_cast<int>(n), f) != nullptr;
      std::fclose(f);
      return got;
    };
    char level[16], type[32], size[32];
    if (!read("level", level, sizeof level)) break;
    if (!read("type", type, sizeof type) || !read("size", size, sizeof size)) continue;
    if (std::strncmp(type, "Instruction", 11) == 0) continue;
    char* end = nullptr;
    const unsigned lv = static_cast<unsigned>(std::strtoul(level, nullptr, 10));
    std::size_t b = std::strtoull(size, &end, 10);
    if (*end == 'K') b <<= 10;
    if (*end == 'M') b <<= 20;
    if (*end == 'G') b <<= 30;
    if (lv > top || (lv == top && b > bytes)) top = lv, bytes = b;
  }
  return bytes;
}

struct comm_config {
  std::chrono::nanoseconds timeout = std::chrono::seconds(600);
  // The pipeline slice; 0 until communicator::create resolves it to slice_default.
  std::size_t slice_bytes = 0;
  static constexpr std::size_t slice_default =
      256 * 1024;  // bench/tune.sh: best of 32K..1M x depth 2, 4 on shm (docs/performance.md)
  // The slice of an all_gather over a network transport (its frames land in the
  // output: no reduce reads them from a slot); 0: the slice. communicator::create
  // sets network_gather_slice_core_per_rank with every rank on one host and a core
  // per rank, unless the slice was set. Over a memory transport it is the slice of an
  // all_gather from memory_gather_slice_from_bytes of output up to the copy slices'
  // range (slice_for); communicator::create sets memory_gather_slice_two_ranks there
  // with 2 ranks and a core each, unless the slice was set: a rank's block of 512 KiB
  // to 4 MiB crosses in fewer slots (2 ranks, shm, the 32 MiB L3 host type: 1M 40.5
  // -> 34.7 us, 2M 79.6 -> 68.2, 4M 162.5 -> 146.9; level below 1M; 4 ranks on 2 cores
  // gained nothing; docs/performance.md, "shm all_gather of 1 to 8 MiB in 512 KiB slices").
  std::size_t gather_slice_bytes = 0;
  static constexpr std::size_t network_gather_slice_core_per_rank =
      512 * 1024;  // docs/performance.md, "TCP on one host: all_gather in 512 KiB slices with a core per rank"
  static constexpr std::size_t memory_gather_slice_two_ranks = 512 * 1024;
  static constexpr std::size_t memory_gather_slice_from_bytes = std::size_t{1} << 20;
  // Slots per FIFO; 0 until communicator::create resolves it to default_depth.
  std::size_t depth = 0;
  static constexpr std::size_t default_depth = 4;
  // How many full frames a link may send ahead of the peer's credits, of any of the
  // slices (it never has more than depth frames out); 0 until communicator::create
  // resolves it: network_window_on_one_host over a network transport (tcp) with every
  // rank on one host, else depth (no cap but the slots). Frames under the smallest
  // slice still fill every slot (link_config::send_window_bytes and _frames).
  std::size_t send_window = 0;
  static constexpr std::size_t network_window_on_one_host =
      3;  // docs/performance.md, "TCP on one host: three slots per FIFO" and "... a send window instead"
  // The slice of plain copies from one rank to another (broadcast, send/recv); 0
  // until communicator::create resolves it: slice_bytes over a network transport,
  // at least copy_slice_default otherwise. Slots hold the largest slice.
  std::size_t copy_slice_bytes = 0;
  static constexpr std::size_t copy_slice_default =
      1024 * 1024;  // docs/performance.md, "Copies without rep movsb, and plain copies in 1 MiB slices"
  // How long a waiting rank polls before it sleeps; negative: automatic (the
  // doorbell's dedicated_spin, or oversubscribed_spin with more ranks than cores).
  std::chrono::nanoseconds poll{-1};
  // Who moves a transport's bytes while a rank waits: the waiting thread itself
  // (link_set::progress, handing back to the transport's thread when it sleeps), or
  // always the transport's own thread (tcp's progress thread).
  bool waiter_io = true;
  // Let a transport that can (shm: CMA) have peers copy large plain sends straight
  // from this rank's memory (link_config::single_copy; PLAIT_SINGLE_COPY).
  bool single_copy = true;
  // Collapse the whole 2 MiB pages of a call's buffers into transparent huge pages
  // before the call (huge_backing; PLAIT_HUGE_PAGES).
  bool huge_pages = true;
  // Congestion control of network links that stay on this host (link_config::
  // host_congestion; PLAIT_TCP_CONGESTION, `system`: empty, the system's). Unset until
  // communicator::create resolves it with host_congestion_for.
  std::optional<std::string> host_congestion;
  // The default: link_config's (reno) with a core per rank; the system's with more
  // ranks than cores, where unpaced frames wake a sleeping peer more often than paced
  // ones (docs/performance.md, "TCP on one host: reno, not a paced congestion control").
  static std::string host_congestion_for(int ranks) {
    return more_ranks_than_cores(ranks) ? std::string() : link_config{}.host_congestion;
  }
  // PLAIT_SINGLE_COPY=always: lend every plain copy the transport can, at any size
  // (tests and measurements; executor::lending_pays is the default).
  bool lend_always = false;
  // all_gather calls whose output is this large or larger write it with non-temporal
  // stores (kernel::copy_bytes_streaming): an output that large does not stay in
  // cache anyway (PLAIT_STREAM_BYTES; `off`: never; executor::streams).
  std::size_t stream_from_bytes = stream_from_default;
  static constexpr std::size_t stream_from_default =
      8 * 1024 * 1024;  // docs/performance.md, "all_gather copies into a large output past the cache"
  // Broadcasts whose output is this large or larger write it with non-temporal stores
  // (executor::streams). 0 until comm_core resolves it (broadcast_stream_from); set
  // with stream_from_bytes by PLAIT_STREAM_BYTES.
  std::size_t broadcast_stream_from_bytes = 0;
  // A broadcast's output larger than half the last-level cache does not stay there
  // with the root's buffer beside it: from there on it is written past the cache (2
  // ranks, shm, 32 MiB L3: 16M 676 against 773 us per call, 24M 1495 against 1295,
  // 64M 4077 against 3522, 128M 8223 against 7355; docs/performance.md, "A
  // broadcast's output past the cache, beyond half the last-level cache"), and with
  // more ranks than cores such a broadcast goes through slots instead of lending
  // (executor::lending_pays; 4 ranks: 32M 4.5-4.8 against 4.9-5.7 ms, 128M 18.2-19.1
  // against 19.5-20.3). Never over a network (not measured), or where the cache's size
  // is unknown.
  static std::size_t broadcast_stream_from(std::size_t llc_bytes, bool network) noexcept {
    if (llc_bytes == 0 || network) return std::numeric_limits<std::size_t>::max();
    return llc_bytes / 2 + 1;
  }
  // The transport's messages are costly (transport_traits::network): `automatic`
  // picks with that in mind. Set by communicator::create from the transport type,
  // and false for a hybrid whose ranks all share one host (only its local transport).
  bool network = false;
  // Every rank has the same host identity (bootstrap_context::host_id: PLAIT_HOST_ID or
  // the host name), agreed at start-up over a network transport: its messages then
  // never cross a wire, and what they cost is the CPU time per message on cores the
  // ranks share, not a link's bandwidth, so `automatic` keeps to the schedules that
  // send the fewest messages at every size. Set by communicator::create.
  bool one_host = false;
  // Over a network transport on one host with every rank bound to one CPU and some
  // CPU carrying two or more ranks: the ranks grouped by CPU (stable), the order
  // ring::broadcast's chain takes (schedule_params::chain), so that most hops stay on
  // one CPU; else empty. Set by communicator::create from rank 0's view; PLAIT_CHAIN
  // `ranks` keeps rank order (docs/performance.md, "Oversubscribed ranks bound round robin").
  std::vector<int> chain;
  bool chain_by_cpu = true;  // PLAIT_CHAIN: `cpus` (default) or `ranks`
  // Over a memory transport (not a network one) with every rank bound to one CPU and
  // some CPU carrying two or more: the ranks grouped by CPU, as `chain` is, for the
  // ring's reductions (ring_follows_cpus); else empty. Set by communicator::create
  // from rank 0's view where the caller left it empty; PLAIT_CHAIN `ranks` leaves it
  // empty.
  std::vector<int> cpu_ring;
  // Whether a ring's all_reduce or reduce_scatter of `bytes` (an all_reduce's vector,
  // a reduce_scatter's whole input) goes round cpu_ring rather than in rank order: on
  // 2 cores, 4 ranks bound round robin, the ring 0 -> 2 -> 1 -> 3 hands two of its
  // four hops to a rank on the same CPU, whose cache already holds the slot, where
  // rank order crosses between the cores at every hop. Measured (docs/performance.md,
  // "Ranks sharing CPUs: the ring's reductions grouped by CPU"), 4 ranks: all_reduce
  // 64K 34 against 49-70 us, 256K 71 against 96-102, 1M 160 against 180-233, level at
  // 2M, behind at 4M; reduce_scatter 128K 30 against 33-41, 256K 40 against 42-46,
  // behind from 512K. 8 ranks alike (all_reduce 256K 193 against 289 us). Every rank
  // computes the same from the same call.
  bool ring_follows_cpus(collective_kind kind, std::size_t bytes) const noexcept {
    if (cpu_ring.empty()) return false;
    if (kind == collective_kind::all_reduce) return bytes < ring_cpus_all_reduce_below_bytes;
    return kind == collective_kind::reduce_scatter && bytes < ring_cpus_reduce_scatter_below_bytes;
  }
  static constexpr std::size_t ring_cpus_all_reduce_below_bytes = std::size_t{2} << 20;
  static constexpr std::size_t ring_cpus_reduce_scatter_below_bytes = std::size_t{512} << 10;
  // Over a network transport on one host, every rank bound to one CPU and some CPU
  // carrying two or more (what the chain is made for, whatever PLAIT_CHAIN says). A
  // reducing step then takes network_slice_shared_cpus unless the slice was set. Set
  // by communicator::create from rank 0's view.
  bool shared_cpus = false;
  static constexpr std::size_t network_slice_shared_cpus =
      128 * 1024;  // docs/performance.md, "TCP, ranks sharing bound CPUs: reducing slices of 128 KiB"
  // The slice of an all_gather over a network transport whose output is under
  // network_gather_small_below_bytes; 0: none (gather_slice_bytes, or the slice).
  // communicator::create sets network_slice_shared_cpus with shared_cpus, unless the
  // slice was set: more, smaller frames let the ranks on one CPU overlap a step's
  // writes and reads (docs/performance.md, "TCP, ranks sharing bound CPUs: all_gather
  // under 2 MiB in 128 KiB slices").
  std::size_t gather_small_slice_bytes = 0;
  static constexpr std::size_t network_gather_small_below_bytes = std::size_t{2} << 20;
  // Every peer can read one copy of a payload (transport_traits::shares_copies, and
  // not a network transport, so a hybrid only on one host): `automatic` takes direct
  // for broadcast and large all_gather. Set by communicator::create.
  bool shares_copies = false;

  // The pipeline slice of a call of this kind with this many bytes of output: plain
  // copies', and all_gather's of 8 to 64 MiB (executor::gather_in_copy_slices), take
  // copy_slice_bytes; all_gather's from memory_gather_slice_from_bytes up to there take
  // gather_slice_bytes, where set. Every rank computes the same from the same call.
  // (all_gather's copy slices are for memory transports: over a network one an
  // all_gather takes gather_small_slice_bytes under network_gather_small_below_bytes,
  // where set, else gather_slice_bytes, where set, or the slice.)
  std::size_t slice_for(collective_kind kind, std::size_t output_bytes = 0) const noexcept {
    if (kind == collective_kind::all_gather && network) {
      if (gather_small_slice_bytes != 0 && output_bytes < network_gather_small_below_bytes)
        return gather_small_slice_bytes;
      if (gather_slice_bytes != 0) return gather_slice_bytes;
    }
    if (kind == collective_kind::all_gather && !network && gather_slice_bytes != 0 &&
        output_bytes >= memory_gather_slice_from_bytes && output_bytes < executor::gather_copy_slice_from)
      return gather_slice_bytes;
    const bool plain_copy =
        kind == collective_kind::broadcast || kind == collective_kind::point_to_point ||
        (kind == collective_kind::all_gather && !network && executor::gather_in_copy_slices(output_bytes));
    return plain_copy && copy_slice_bytes != 0 ? copy_slice_bytes : slice_bytes;
  }
  // A slot's payload capacity: the largest slice.
  std::size_t slot_bytes() const noexcept {
    return std::max({slice_bytes, copy_slice_bytes, gather_slice_bytes, gather_small_slice_bytes});
  }
};

class comm_core {
 public:
  comm_core(int rank, int size, comm_config cfg)
      : rank_(rank),
        size_(size),
        cfg_(cfg),
        lend_choice_(slots_warmup_calls(cfg), retime_lending_every),
        broadcast_lend_choice_(slots_warmup_calls(cfg), retime_lending_every),
        all_reduce_stream_choice_("all_reduce", retime_streaming_every),
        reduce_scatter_stream_choice_("reduce_scatter", retime_streaming_every),
        p2p_sent_(static_cast<std::size_t>(size), 0),
        p2p_received_(static_cast<std::size_t>(size), 0),
        last_seen_(2 * static_cast<std::size_t>(size), 0) {
    if (cfg_.slice_bytes == 0) cfg_.slice_bytes = comm_config::slice_default;  // built without create
    // Oversubscribed (more ranks than cores on this host is likely): poll less.
    oversubscribed_ = more_ranks_than_cores(size);
    if (cfg_.broadcast_stream_from_bytes == 0)
      cfg_.broadcast_stream_from_bytes = comm_config::broadcast_stream_from(last_level_cache_bytes(), cfg_.network);
    if (cfg_.poll.count() >= 0)
      bell_.set_spin(cfg_.poll);
    else if (oversubscribed_)
      bell_.set_spin(doorbell::oversubscribed_spin);
  }

  comm_core(const comm_core&) = delete;
  comm_core& operator=(const comm_core&) = delete;

  ~comm_core() {
    stop_worker();
    if (links_) links_->close(reason_to_close());
  }

  void attach(std::unique_ptr<link_set> links, std::unique_ptr<bootstrap_context> ctx,
              std::shared_ptr<void> keepalive) {
    links_ = std::move(links);
    ctx_ = std::move(ctx);
    keepalive_ = std::move(keepalive);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  doorbell& bell() noexcept { return bell_; }
  const comm_config& config() const noexcept { return cfg_; }
  void set_timeout(std::chrono::nanoseconds t) { cfg_.timeout = t; }

  std::uint64_t next_sequence() noexcept { return ++sequence_; }

  // A call to fill in: a finished one reused when there is one (no allocation); the
  // last blocking call's first, which only the issuing thread touches (no lock).
  std::unique_ptr<call> take_call() {
    if (blocking_call_) return std::move(blocking_call_);
    return take_spare(spare_calls_, [] { return std::make_unique<call>(); });
  }

  // What a schedule is made from: the algorithm's parameters (rank and size are the
  // communicator's), and for send and recv the peer and the direction.
  struct schedule_key {
    collective_kind kind = collective_kind::none;
    std::uint8_t algorithm = 0;
    int root = 0;
    std::size_t count = 0;
    std::size_t slice_elems = 0;
    int peer = -1;  // of a send or recv
    bool receiving = false;
    bool operator==(const schedule_key&) const = default;
  };

  // The schedule made from `key` by `make` (an algorithm), kept for the next calls
  // made from the same key: a loop of the same collective builds it once. Called
  // from the thread issuing calls (one at a time), so it needs no lock.
  template <class Make>
  const schedule& schedule_for(const schedule_key& key, Make&& make) {
    for (auto& e : schedules_)
      if (e.used && e.key == key) return e.steps;
    cached_schedule& e = schedules_[next_schedule_++ % schedules_.size()];
    e.used = false;  // stays unused if make() throws
    e.steps = make();
    e.key = key;
    e.used = true;
    return e.steps;
  }
  std::uint64_t next_send(int peer) noexcept { return ++p2p_sent_[static_cast<std::size_t>(peer)]; }
  std::uint64_t next_recv(int peer) noexcept { return ++p2p_received_[static_cast<std::size_t>(peer)]; }

  // A call's time: call_options::timeout, else the communicator's. The deadline is
  // set when the call enters the engine (enqueue, or the first pass of run()).
  std::chrono::nanoseconds timeout_for(std::chrono::milliseconds per_call) const noexcept {
    return per_call.count() > 0 ? std::chrono::nanoseconds(per_call) : cfg_.timeout;
  }

  // Before a call (on the caller's thread): the whole 2 MiB pages of one of its
  // buffers onto huge pages (huge_backing). A collapse that did work, or failed, is
  // logged at info; a range asked again and found done, at trace.
  void back_by_huge_pages(const void* p, std::size_t bytes) noexcept {
    if (!cfg_.huge_pages || p == nullptr) return;
    const huge_backing::asked a = huge_.back(p, bytes);
    if (a.bytes == 0) return;
    const double ms = std::chrono::duration<double, std::milli>(a.took).count();
    if (a.error == 0)
      log(a.took >= std::chrono::milliseconds(1) ? log_level::info : log_level::trace, "huge pages: ", a.bytes >> 20,
          " MiB of a call's buffer at ", p, " collapsed or found so in ", ms, " ms");
    else
      log(log_level::info, "huge pages: the kernel did not collapse ", a.bytes >> 20, " MiB of a call's buffer at ", p,
          " (", std::strerror(a.error), "); its pages stay as they are");
  }

  // Called twice per call: the flag keeps the lock off the path of a healthy communicator.
  void throw_if_broken() const {
    if (!broken_flag_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(broken_mutex_);
    if (broken_) throw *broken_;
  }

  // A locally detected misuse: use up the sequence number, tell the peers, break.
  [[noreturn]] void reject(const call_desc& d, std::string message) {
    error e(errc::invalid_argument, std::move(message), rank_, -1, d.sequence);
    try {
      finish_all();  // earlier calls first: the notice must follow their slots
    } catch (...) {
    }
    std::lock_guard lock(engine_mutex_);
    executor ex = make_executor();
    ex.send_notice(d, clock::now() + std::min<std::chrono::nanoseconds>(cfg_.timeout, std::chrono::seconds(5)), rank_,
                   errc::invalid_argument);
    mark_broken(e);
    throw e;
  }

  // Runs a blocking call on the caller's thread (driving any async calls before it too).
  // Its flight is the one kept for blocking calls (only the issuing thread runs them,
  // one at a time), and the first pass of the drive takes it in: one lock and one
  // clock read fewer per call than an async call's path.
  void run(std::unique_ptr<call> c) {
    throw_if_broken();
    // Still held elsewhere only if an earlier run() left by an exception with its
    // call in flight: then that one stays where it is and this call gets a new one.
    if (!blocking_ || blocking_.use_count() != 1) {
      blocking_ = std::make_shared<flight>();
      blocking_->keeps_call = true;
    }
    flight& f = *blocking_;
    f.c = std::move(c);
    f.c->count_peers(size_);
    drive_until([&] { return f.finished; }, &blocking_);
    std::exception_ptr failure = std::move(f.failure);
    f.finished = false;
    f.failure = nullptr;
    if (f.c) {
      f.c->reset();
      blocking_call_ = std::move(f.c);
    }
    if (failure) std::rethrow_exception(failure);
  }

  // Queues an async call; the progress thread drives it.
  request submit(std::unique_ptr<call> c) {
    throw_if_broken();
    std::shared_ptr<flight> f = take_flight();
    f->c = std::move(c);
    f->state = std::make_shared<request_state>();
    request r(f->state);
    {
      std::lock_guard lock(worker_mutex_);
      if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    }
    enqueue(f);
    worker_cv_.notify_all();
    return r;
  }

  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    bell_.ring();
    worker_cv_.notify_all();
    if (engine_mutex_.try_lock()) {  // nobody is driving: fail what is queued and close now
      fail_all(std::make_exception_ptr(
          error(errc::aborted, "abort() was called on this communicator; recreate it to go on", rank_)));
      if (links_) links_->close({errc::aborted, -1, false});
      engine_mutex_.unlock();
    }
  }

 private:
  // One call in flight; `state` is set for async calls.
  struct flight {
    std::unique_ptr<call> c;
    std::shared_ptr<request_state> state;
    bool finished = false;
    std::exception_ptr failure;
    // run()'s flight: its finished call stays in it for run() to keep (a drive on
    // another thread must not hand it to the spare list, which the lock guards).
    bool keeps_call = false;
  };

  // A finished call leaves the engine (holds engine_mutex_).
  void retire(flight& f) noexcept {
    if (!f.keeps_call) recycle(std::move(f.c));
  }

  // A finished call goes back to the spare list (its memory is reused by take_call).
  void recycle(std::unique_ptr<call> c) noexcept {
    if (!c) return;
    c->reset();
    std::lock_guard lock(spare_mutex_);
    if (spare_calls_.size() < max_spare_calls) spare_calls_.push_back(std::move(c));
  }

  std::shared_ptr<flight> take_flight() {
    return take_spare(spare_flights_, [] { return std::make_shared<flight>(); });
  }

  // The last of `spares` (finished calls or flights), or a new one from `make`.
  template <class P, class Make>
  P take_spare(std::vector<P>& spares, Make make) {
    {
      std::lock_guard lock(spare_mutex_);
      if (!spares.empty()) {
        P p = std::move(spares.back());
        spares.pop_back();
        return p;
      }
    }
    return make();
  }

  // Back to the spare list once nobody else holds it.
  void recycle_flight(std::shared_ptr<flight> f) noexcept {
    if (!f || f.use_count() != 1) return;
    recycle(std::move(f->c));
    f->state.reset();
    f->finished = false;
    f->failure = nullptr;
    f->keeps_call = false;  // a blocking flight that run() gave up on serves async calls now
    std::lock_guard lock(spare_mutex_);
    if (spare_flights_.size() < max_spare_calls) spare_flights_.push_back(std::move(f));
  }

  void enqueue(const std::shared_ptr<flight>& f) {
    f->c->count_peers(size_);
    std::lock_guard lock(engine_mutex_);
    take_in(f, clock::now());
  }

  // The call enters the engine: its deadline starts now. Holds engine_mutex_.
  void take_in(const std::shared_ptr<flight>& f, clock::time_point now) {
    call& c = *f->c;
    c.deadline = now + c.timeout;
    if (times_lending(c)) {
      c.lend = lend_choice_.next(gather_bytes(c), c.timed);
    } else if (times_reduction_streaming(c)) {
      c.stream = stream_choice_for(c).next(call_bytes(c), c.timed);
    } else {
      // A broadcast times its slots' fill first (stream_choice), then lending against
      // those slots (broadcast_lend_choice).
      bool settled = false;
      const bool streaming = times_streaming(c);
      const bool exploring = streaming && stream_choice_.exploring(call_bytes(c));
      if (streaming) {
        const stream_plan plan = stream_choice_.next(call_bytes(c), c.timed, settled);
        if (settled && plan != stream_plan::rule)
          links_->measured_streamed_slots(call_bytes(c), plan == stream_plan::stream);
        c.stream = exploring ? plan : stream_plan::rule;
      }
      if (!exploring && times_broadcast_lending(c)) {
        const bool lend_exploring = broadcast_lend_choice_.exploring(call_bytes(c));
        const lend_plan plan = broadcast_lend_choice_.next(call_bytes(c), c.timed, settled);
        if (settled && plan != lend_plan::rule) links_->measured_lending(call_bytes(c), plan == lend_plan::lend);
        // Once a size has settled, what this rank read faster is for its senders: its
        // own sends (a rank inside a tree) follow what its own readers measured.
        c.lend = lend_exploring ? plan : lend_plan::rule;  // likewise for c.stream above
      }
    }
    active_.push_back(f);
  }

  // Drives every call in flight until `done()` holds (checked under the engine lock);
  // the first pass takes `add` in, if given. One clock read per pass (a read costs
  // about 30 ns here, a small call about 400): the pass's `now` also starts the
  // call's deadline, the health interval and the doorbell's poll.
  template <class Done>
  void drive_until(Done done, const std::shared_ptr<flight>* add = nullptr) {
    clock::time_point last_health{};
    for (;;) {
      const std::uint32_t seen = bell_.snapshot();
      clock::time_point next_deadline = clock::time_point::max();
      std::optional<call_desc> stuck;
      clock::time_point now;
      {
        std::lock_guard lock(engine_mutex_);
        now = clock::now();
        if (add != nullptr) take_in(*add, now), add = nullptr;
        if (last_health == clock::time_point{}) last_health = now;
        const bool health = now - last_health > std::chrono::milliseconds(20);
        if (health) last_health = now;
        drive_once(now, health);
        if (done()) {
          if (links_ && cfg_.waiter_io) links_->release_io(true);
          return;
        }
        for (auto& f : active_) next_deadline = std::min(next_deadline, f->c->deadline);
        stuck = stalled_call(now);
      }
      if (stuck) {
        diagnose(*stuck);
        now = clock::now();  // diagnosing may take a while (the store)
      }
      // Measured from before the pass: a long pass (a large copy) shortens the poll
      // and the sleep, never lengthens them past a deadline by more than the pass.
      auto bound = std::chrono::duration_cast<std::chrono::nanoseconds>(executor::max_sleep);
      if (next_deadline != clock::time_point::max() && next_deadline - now < bound)
        bound = std::max(std::chrono::nanoseconds(0), std::chrono::nanoseconds(next_deadline - now));
      if (links_ && cfg_.waiter_io)
        bell_.wait(seen, bound, io_waiter{links_.get()}, now);
      else
        bell_.wait(seen, bound, doorbell::no_io{}, now);
    }
  }

  // The oldest call in flight, if it has not moved for a while (holds engine_mutex_).
  std::optional<call_desc> stalled_call(clock::time_point now) {
    if (active_.empty() || ctx_ == nullptr) return std::nullopt;
    const call& c = *active_.front()->c;
    if (c.desc.sequence != stall_sequence_ || c.desc.kind != stall_kind_ || c.next != stall_step_) {
      stall_sequence_ = c.desc.sequence;
      stall_kind_ = c.desc.kind;
      stall_step_ = c.next;
      stall_since_ = now;
      return std::nullopt;
    }
    const auto patience = std::min<std::chrono::nanoseconds>(std::chrono::seconds(1), cfg_.timeout / 3);
    if (c.desc.kind == collective_kind::point_to_point || now - stall_since_ < patience) return std::nullopt;
    return c.desc;
  }

  // Nothing moves: maybe no rank sends because they disagree on the call (a broadcast
  // whose root differs between ranks sends nothing anyone expects). Each stalled rank
  // publishes the call it is in through the store and compares with the others': a
  // different call under the same sequence number is a mismatch, found out of band,
  // with no cost while data flows.
  void diagnose(const call_desc& mine) {
    std::unique_lock guard(diag_mutex_, std::try_to_lock);
    if (!guard.owns_lock() || clock::now() - last_diagnosis_ < std::chrono::milliseconds(200)) return;
    last_diagnosis_ = clock::now();
    std::optional<error> found;
    try {
      ctx_->put("stalled/" + std::to_string(rank_), std::as_bytes(std::span(&mine, 1)));
      for (int p = 0; p < size_ && !found; ++p) {
        if (p == rank_) continue;
        auto got = ctx_->try_get("stalled/" + std::to_string(p));
        if (!got || got->size() != sizeof(call_desc)) continue;
        call_desc theirs;
        std::memcpy(&theirs, got->data(), sizeof theirs);
        if (theirs.sequence == mine.sequence && !(theirs == mine))
          found = error(errc::mismatch,
                        "this rank called " + std::string(to_string(mine.kind)) + " but rank " + std::to_string(p) +
                            " called " + to_string(theirs.kind) + " as collective #" + std::to_string(mine.sequence) +
                            ": " + describe_difference(mine, theirs) +
                            " (found while both waited for data that neither was going to send); every rank must "
                            "issue the same collectives in the same order with the same arguments",
                        rank_, p, mine.sequence);
      }
    } catch (const error&) {
      return;  // the store is unreachable: the call's own deadline still holds
    }
    if (!found) return;
    std::lock_guard lock(engine_mutex_);
    if (active_.empty() || active_.front()->c->desc.sequence != mine.sequence) return;  // it moved meanwhile
    executor ex = make_executor();
    on_failure(ex, *found);
    fail_all(std::make_exception_ptr(*found));
  }

  // Waits until every call issued so far has finished (successfully or not).
  void finish_all() {
    drive_until([&] { return active_.empty(); });
  }

  // Advances every call in issue order; completes the finished ones. Holds engine_mutex_.
  void drive_once(clock::time_point now, bool health) {
    if (active_.empty()) return;
    executor ex = make_executor();
    std::vector<call*>& earlier = earlier_;
    earlier.clear();
    try {
      for (auto& f : active_) {
        call& c = *f->c;
        const bool complete = (size_ == 1 || links_ == nullptr) ? ex.advance(c) : ex.advance(c, earlier);
        if (!complete) {
          if (size_ == 1 || links_ == nullptr)
            throw error(errc::protocol, "a single-rank schedule needs a peer (internal error)", rank_);
          ex.check(c, now, health);
        }
        earlier.push_back(&c);
      }
    } catch (const error& e) {
      on_failure(ex, e);
      fail_all(std::current_exception());
      return;
    }
    while (!active_.empty() && active_.front()->c->done()) {
      if (const call& c = *active_.front()->c; c.timed) {
        const auto took = clock::now() - (c.deadline - c.timeout);
        if (c.desc.kind == collective_kind::all_gather)
          lend_choice_.record(gather_bytes(c), c.lend, took);
        else if (c.desc.kind == collective_kind::all_reduce || c.desc.kind == collective_kind::reduce_scatter)
          stream_choice_for(c).record(call_bytes(c), c.stream, took);
        else if (c.desc.root != rank_)  // a broadcast: the readers' times are what counts
          record_broadcast(c, took);
      }
      finish(*active_.front(), nullptr);
      retire(*active_.front());
      std::shared_ptr<flight> done = std::move(active_.front());
      active_.pop_front();
      recycle_flight(std::move(done));  // an async one; run() keeps the blocking one
    }
  }

  // The calls after which a size's choice between lending and slots is timed again
  // (lend_choice, broadcast_lend_choice): where the two cores' caches trade dirty
  // lines slowly for a while (2 ranks, shm, the 32 MiB L3 host type: 1 MiB of slots in
  // 230-470 us per call for seconds at a time, against 23-28; lending 80-100 all the
  // while), the plan timed first is the wrong one until the next timing
  // (docs/performance.md, "A settled size is timed again"). 13 calls of 1000 explore.
  // stream_choice is timed once: both its plans go through slots.
  static constexpr int retime_lending_every = 1000;
  // The same for a reduction's choice between slots written past the cache and plain
  // ones: that window turns the choice around (2 ranks, 1 MiB all_reduce: plain 57 us
  // and streamed 139 outside it, 810 and 104-110 inside). 6 calls of 1000 explore, 3 of
  // them under the plan not kept.
  static constexpr int retime_streaming_every = 1000;
  // The untimed calls that open a timed block through slots after one that lent: one
  // per slot of the FIFO, so that every slot has been written once before a call is
  // timed (the first write to a slot finds it out of the cache: 2 ranks, shm, a 1 MiB
  // broadcast's slots block took 66-133 us at its best timed call on the 32 MiB L3
  // host type, against 23-28 per call once each slot had been written;
  // docs/performance.md, "A plan through slots is timed once every slot is warm").
  // At most 16, whatever PLAIT_DEPTH says.
  static int slots_warmup_calls(const comm_config& cfg) noexcept {
    return static_cast<int>(std::min<std::size_t>(cfg.depth != 0 ? cfg.depth : comm_config::default_depth, 16));
  }
  // An all_gather whose sends may lend from any memory (a core per rank, shm's single
  // copy on, PLAIT_SINGLE_COPY not `always`), from executor::lend_gather_from_bytes
  // below the copy slices' range (executor::gather_in_copy_slices, tuned for lending
  // on its own): lend_choice picks lending or slots for its size (docs/performance.md,
  // "all_gather lends or not, by timing both").
  bool times_lending(const call& c) const noexcept {
    if (c.desc.kind != collective_kind::all_gather || oversubscribed_ || links_ == nullptr || size_ < 2 ||
        !cfg_.single_copy || cfg_.lend_always || !cfg_.shares_copies || cfg_.network)
      return false;
    const std::size_t bytes = gather_bytes(c);
    return bytes >= executor::lend_gather_from_bytes && bytes < executor::lend_from_call_bytes;
  }
  // A broadcast's timed call goes to the choice exploring it: stream_choice until it
  // has settled for the size, then broadcast_lend_choice (take_in). Each ignores a
  // time once settled, and a plan not its own.
  void record_broadcast(const call& c, std::chrono::nanoseconds took) noexcept {
    if (c.lend == lend_plan::rule)
      stream_choice_.record(call_bytes(c), c.stream, took);
    else
      broadcast_lend_choice_.record(call_bytes(c), c.lend, took);
  }
  // A broadcast with a core per rank, from executor::lend_broadcast_from_bytes, where shm
  // can lend the root's buffer from any memory: broadcast_lend_choice times lending
  // against slots for its size, on the ranks that receive, once stream_choice has
  // settled where it times the size (docs/performance.md, "broadcast lends or not, by
  // timing both"); a call of several slices lends each ("A broadcast of several slices
  // lends or not, by timing both").
  bool times_broadcast_lending(const call& c) const noexcept {
    if (c.desc.kind != collective_kind::broadcast || oversubscribed_ || links_ == nullptr || size_ < 2 ||
        !cfg_.single_copy || cfg_.lend_always || !cfg_.shares_copies || cfg_.network)
      return false;
    return call_bytes(c) >= executor::lend_broadcast_from_bytes;
  }
  // A broadcast of one slot that the transport may write past the cache, with a core
  // per rank (executor::streams_slots): stream_choice times streamed slots against
  // plain ones for its size, on the ranks that receive (docs/performance.md, "Slots
  // written past the cache or not, by timing both").
  bool times_streaming(const call& c) const noexcept {
    if (c.desc.kind != collective_kind::broadcast || oversubscribed_ || links_ == nullptr || size_ < 2 ||
        cfg_.network || cfg_.lend_always)
      return false;
    const std::size_t bytes = call_bytes(c);
    return bytes <= cfg_.slice_for(collective_kind::broadcast) && links_->streams_slots((rank_ + 1) % size_, bytes);
  }
  // An all_reduce or a reduce_scatter with a core per rank, from
  // executor::stream_reduction_from_bytes, whose transport lets a peer read slots
  // written past the cache: its size's choice times slots written so against plain
  // ones, every rank its own calls, and each rank then writes its own slots as it found
  // faster (executor::streams_reduction_slots; docs/performance.md, "Reductions' slots
  // past the cache, by timing both").
  bool times_reduction_streaming(const call& c) const noexcept {
    if ((c.desc.kind != collective_kind::all_reduce && c.desc.kind != collective_kind::reduce_scatter) ||
        oversubscribed_ || links_ == nullptr || size_ < 2 || cfg_.network)
      return false;
    return call_bytes(c) >= executor::stream_reduction_from_bytes && links_->can_stream_slots((rank_ + 1) % size_);
  }
  reduction_stream_choice& stream_choice_for(const call& c) noexcept {
    return c.desc.kind == collective_kind::all_reduce ? all_reduce_stream_choice_ : reduce_scatter_stream_choice_;
  }
  std::size_t call_bytes(const call& c) const noexcept { return static_cast<std::size_t>(c.desc.count) * c.elem_size; }
  std::size_t gather_bytes(const call& c) const noexcept {
    return static_cast<std::size_t>(c.desc.count) * c.elem_size * static_cast<std::size_t>(size_);
  }

  executor make_executor() {
    return executor(rank_, size_, links_.get(), bell_, aborted_, last_seen_, oversubscribed_, cfg_.lend_always,
                    cfg_.stream_from_bytes, cfg_.broadcast_stream_from_bytes);
  }

  void on_failure(executor& ex, const error& e) {
    mark_broken(e);
    if (links_ == nullptr) return;
    const call_desc d = active_.empty() ? call_desc{} : active_.front()->c->desc;
    if (e.code() == errc::mismatch || e.code() == errc::protocol)
      ex.send_notice(d, clock::now() + std::chrono::milliseconds(200), e.peer() >= 0 ? e.peer() : rank_, e.code());
    else if (e.code() == errc::peer_lost)
      links_->close({errc::peer_lost, e.peer(), false});  // peers waiting on this rank learn whom it lost
    else if (e.code() != errc::timeout)
      links_->close({e.code(), -1, false});  // peers waiting on this rank learn at once instead of timing out
    // A timeout closes nothing: the others reach their own deadlines (a stopped peer is
    // named by each), and this rank's links close, naming it, when it is destroyed.
  }

  // Fails every call in flight with `e` (the communicator is broken). Holds engine_mutex_.
  void fail_all(std::exception_ptr e) {
    // Payloads still to be sent from the failed calls' buffers move into the slots
    // first: the caller may free its buffers once the call has thrown.
    if (links_ && !active_.empty()) links_->detach();
    for (auto& f : active_) {
      finish(*f, e);
      retire(*f);
    }
    active_.clear();
  }

  void finish(flight& f, std::exception_ptr e) {
    f.failure = e;
    f.finished = true;
    if (f.state) f.state->complete(e);
  }

  // How this rank's links close when it is destroyed: cleanly (delivering what it
  // posted) unless it is broken, in which case the peers learn whom it gave up on.
  close_reason reason_to_close() const {
    std::lock_guard lock(broken_mutex_);
    if (!broken_) return {};
    const errc code = broken_->code();
    if ((code == errc::peer_lost || code == errc::timeout) && broken_->peer() >= 0)
      return {code, broken_->peer(), false};
    return {errc::aborted, -1, false};
  }

  void mark_broken(const error& e) {
    std::lock_guard lock(broken_mutex_);
    if (!broken_) broken_ = e;
    broken_flag_.store(true, std::memory_order_release);
  }

  // The progress thread: drives async calls while any are in flight.
  void work() {
    for (;;) {
      {
        std::unique_lock lock(worker_mutex_);
        worker_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_.load() || has_active(); });
        if (stopping_.load()) return;
      }
      if (!has_active()) continue;
      drive_until([&] { return active_.empty() || stopping_.load(); });
    }
  }

  bool has_active() {
    std::lock_guard lock(engine_mutex_);
    return !active_.empty();
  }

  void stop_worker() noexcept {
    stopping_.store(true);
    bell_.ring();
    worker_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    std::lock_guard lock(engine_mutex_);
    if (!active_.empty())
      fail_all(std::make_exception_ptr(
          error(errc::aborted, "the communicator was destroyed before this collective completed", rank_)));
  }

  int rank_, size_;
  comm_config cfg_;
  bool oversubscribed_ = false;                  // more ranks than cores on this host (likely)
  lend_choice lend_choice_;                      // all_gather: lend or slots, per output size (times_lending)
  stream_choice stream_choice_;                  // broadcast: slots streamed or plain, per size (times_streaming)
  broadcast_lend_choice broadcast_lend_choice_;  // broadcast: lend or slots, per size (times_broadcast_lending)
  // all_reduce, reduce_scatter: slots streamed or plain, per size (times_reduction_streaming)
  reduction_stream_choice all_reduce_stream_choice_, reduce_scatter_stream_choice_;
  huge_backing huge_;  // the caller's buffers on huge pages (back_by_huge_pages)
  doorbell bell_;
  std::unique_ptr<link_set> links_;
  std::unique_ptr<bootstrap_context> ctx_;
  std::shared_ptr<void> keepalive_;  // the store client and server this communicator was made with

  std::uint64_t sequence_ = 0;
  std::vector<std::uint64_t> p2p_sent_, p2p_received_;
  std::vector<std::uint64_t> last_seen_;  // per peer, collective and send/recv sequences seen (engine_mutex_)
  std::vector<call*> earlier_;            // drive_once's scratch list, kept to avoid allocating per pass
  std::atomic<bool> aborted_{false};

  mutable std::mutex broken_mutex_;
  std::optional<error> broken_;
  std::atomic<bool> broken_flag_{false};  // set once broken_ is (after it, under broken_mutex_)

  std::mutex engine_mutex_;  // held while driving calls; guards active_
  fifo_list<std::shared_ptr<flight>> active_;
  std::mutex diag_mutex_;  // one stall diagnosis at a time
  clock::time_point last_diagnosis_{};
  std::uint64_t stall_sequence_ = 0;  // the oldest call in flight when it last moved (engine_mutex_)
  collective_kind stall_kind_ = collective_kind::none;
  std::size_t stall_step_ = 0;
  clock::time_point stall_since_{};
  std::mutex worker_mutex_;
  std::condition_variable worker_cv_;
  std::atomic<bool> stopping_{false};
  std::thread worker_;

  static constexpr std::size_t max_spare_calls = 4;
  std::mutex spare_mutex_;  // finished calls come back from whichever thread drove them
  std::vector<std::unique_ptr<call>> spare_calls_;
  std::vector<std::shared_ptr<flight>> spare_flights_;
  std::shared_ptr<flight> blocking_;     // run()'s flight, reused (the thread issuing calls only)
  std::unique_ptr<call> blocking_call_;  // run()'s last call, reset, for take_call (the same thread)
  struct cached_schedule {
    bool used = false;
    schedule_key key;
    schedule steps;
  };
  std::array<cached_schedule, 8> schedules_{};  // the thread issuing calls only
  std::size_t next_schedule_ = 0;
};

}  // namespace plait::detail
