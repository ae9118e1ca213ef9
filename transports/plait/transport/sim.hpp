// plait::transport::sim — ranks as threads of one process, FIFOs in ordinary memory.
//
// For algorithm research and fast tests: the same slot FIFOs, executor and kernels
// as the real transports, with no processes, sockets or shared segments. Ranks
// rendezvous through a process-wide registry keyed by the bootstrap job key.
// Each directed pair has a single-producer/single-consumer FIFO of `depth` slots;
// posting rings the receiver's doorbell, releasing rings the sender's.
// A rank whose link_set is closed or destroyed is reported as peer_lost to peers
// that still wait on it.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <plait/transport.hpp>

namespace plait::transport {

namespace detail_sim {

struct fifo {
  std::size_t depth = 0, stride = 0;
  std::vector<std::byte> storage;
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  std::byte* slot(std::uint64_t i) { return storage.data() + (i % depth) * stride; }
};

struct fabric {
  int size = 0;
  std::size_t slot_bytes = 0;
  std::vector<std::unique_ptr<fifo>> fifos;  // [from * size + to]
  // Each rank's doorbell word lives here, not in its communicator: a peer may still ring
  // it while that rank's communicator is being destroyed; the fabric outlives every ringer.
  std::vector<plait::detail::doorbell_word> bells;
  std::vector<std::atomic<bool>> closed;
  std::vector<std::atomic<int>> blamed;      // culprit named by a rank that closed after losing it
  std::vector<std::atomic<int>> blame_code;  // the errc it closed with
  fabric(int n, std::size_t slot, std::size_t depth)
      : size(n),
        slot_bytes(slot),
        bells(static_cast<std::size_t>(n)),
        closed(static_cast<std::size_t>(n)),
        blamed(static_cast<std::size_t>(n)),
        blame_code(static_cast<std::size_t>(n)) {
    for (auto& b : blamed) b.store(-1);
    for (int i = 0; i < n * n; ++i) {
      auto f = std::make_unique<fifo>();
      f->depth = depth;
      f->stride = sizeof(plait::detail::slot_header) + slot;
      f->storage.resize(depth * f->stride);
      fifos.push_back(std::move(f));
    }
  }
  fifo& at(int from, int to) { return *fifos[static_cast<std::size_t>(from * size + to)]; }
  void ring(int rank) { plait::detail::doorbell::ring(&bells[static_cast<std::size_t>(rank)]); }
};

// Where a doorbell points once its fabric may be gone: a word nobody else rings.
inline plait::detail::doorbell_word detached_bell{};

inline std::shared_ptr<fabric> find_or_make(const std::string& key, int n, std::size_t slot, std::size_t depth) {
  static std::mutex m;
  static std::map<std::string, std::weak_ptr<fabric>> registry;
  std::lock_guard lock(m);
  if (auto f = registry[key].lock()) return f;
  auto f = std::make_shared<fabric>(n, slot, depth);
  registry[key] = f;
  return f;
}

class links final : public link_set {
 public:
  links(std::shared_ptr<fabric> f, int rank, plait::detail::doorbell& bell)
      : f_(std::move(f)), rank_(rank), bell_(&bell) {}
  ~links() override {
    close();
    if (bell_->word() == &f_->bells[static_cast<std::size_t>(rank_)]) bell_->bind(&detached_bell);
  }

  bool reaches(int peer) const override { return peer != rank_ && peer >= 0 && peer < f_->size; }
  std::size_t slot_bytes() const override { return f_->slot_bytes; }

  std::byte* acquire(int peer) override {
    fifo& q = f_->at(rank_, peer);
    const auto t = q.tail.load(std::memory_order_relaxed);
    if (t - q.head.load(std::memory_order_acquire) >= q.depth) return nullptr;
    return q.slot(t) + sizeof(plait::detail::slot_header);
  }
  void post(int peer, const plait::detail::slot_header& h) override {
    fifo& q = f_->at(rank_, peer);
    const auto t = q.tail.load(std::memory_order_relaxed);
    std::memcpy(q.slot(t), &h, sizeof h);
    q.tail.store(t + 1, std::memory_order_release);
    f_->ring(peer);
  }
  slot_view peek(int peer) override {
    fifo& q = f_->at(peer, rank_);
    const auto h = q.head.load(std::memory_order_relaxed);
    if (h == q.tail.load(std::memory_order_acquire)) return {};
    std::byte* s = q.slot(h);
    return {reinterpret_cast<const plait::detail::slot_header*>(s), s + sizeof(plait::detail::slot_header)};
  }
  void release(int peer) override {
    fifo& q = f_->at(peer, rank_);
    q.head.fetch_add(1, std::memory_order_release);
    f_->ring(peer);
  }
  void health(int peer) override {
    if (f_->closed[static_cast<std::size_t>(peer)].load()) {
      const int culprit = f_->blamed[static_cast<std::size_t>(peer)].load();
      if (f_->blame_code[static_cast<std::size_t>(peer)].load() == static_cast<int>(errc::timeout) &&
          (culprit < 0 || culprit == rank_))  // it gave up waiting for this rank: not a loss
        throw error(errc::timeout, "rank " + std::to_string(peer) + " timed out waiting and closed its links", rank_,
                    peer);
      if (culprit >= 0 && culprit != rank_)
        throw error(
            static_cast<errc>(f_->blame_code[static_cast<std::size_t>(peer)].load()),
            "rank " + std::to_string(peer) + " gave up on rank " + std::to_string(culprit) + " and closed its links",
            rank_, culprit);
      throw error(errc::peer_lost, "rank " + std::to_string(peer) + " closed its links", rank_, peer);
    }
  }
  void close(close_reason why = {}) noexcept override {
    if (f_->closed[static_cast<std::size_t>(rank_)].load()) return;  // the first reason stands
    if (why.code == errc::peer_lost || why.code == errc::timeout) {
      f_->blame_code[static_cast<std::size_t>(rank_)].store(static_cast<int>(why.code));
      f_->blamed[static_cast<std::size_t>(rank_)].store(why.culprit);
    }
    if (f_->closed[static_cast<std::size_t>(rank_)].exchange(true)) return;
    for (int p = 0; p < f_->size; ++p)
      if (p != rank_) f_->ring(p);
  }

 private:
  std::shared_ptr<fabric> f_;
  int rank_;
  plait::detail::doorbell* bell_;
};

}  // namespace detail_sim

struct sim {
  static constexpr transport_traits traits{.device_memory = false, .one_sided = true, .zero_copy = true};
  static constexpr std::string_view name = "sim";

  static std::unique_ptr<link_set> connect(bootstrap_context& ctx, plait::detail::doorbell& bell,
                                           const link_config& cfg, std::span<const int>) {
    auto f = detail_sim::find_or_make(ctx.job_key(), ctx.size(), cfg.slot_bytes, cfg.depth);
    bell.bind(&f->bells[static_cast<std::size_t>(ctx.rank())]);
    auto l = std::make_unique<detail_sim::links>(f, ctx.rank(), bell);
    ctx.barrier("sim-connected", clock::now() + cfg.connect_timeout);
    return l;
  }
};

}  // namespace plait::transport

static_assert(plait::transport_for<plait::transport::sim>);
