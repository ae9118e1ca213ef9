// plait::transport::hybrid<Local, Remote> — Local to ranks on this host, Remote to the rest.
//
// "This host" is the host identity (PLAIT_HOST_ID, else the hostname): ranks that
// publish the same identity are connected through Local (e.g. shm), all others
// through Remote (e.g. tcp). Every rank connects both transports (possibly with no
// peers), so their collective set-up steps line up. Local connects first, so that a
// transport that moves the doorbell into shared memory (shm) does so before Remote's
// progress thread can ring it. The link_set routes each call by peer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <plait/transport.hpp>

namespace plait::transport {

namespace detail_hybrid {

class links final : public link_set {
 public:
  links(std::unique_ptr<link_set> local, std::unique_ptr<link_set> remote, std::vector<link_set*> route)
      : local_(std::move(local)), remote_(std::move(remote)), route_(std::move(route)) {}
  ~links() override { close(); }

  bool reaches(int peer) const override { return at(peer) != nullptr; }
  std::size_t slot_bytes() const override { return local_->slot_bytes(); }
  std::byte* acquire(int peer) override { return at(peer)->acquire(peer); }
  void post(int peer, const plait::detail::slot_header& h) override { at(peer)->post(peer, h); }
  bool sends_from_memory(int peer) const override { return at(peer)->sends_from_memory(peer); }
  std::uint64_t post_from(int peer, const plait::detail::slot_header& h, const std::byte* payload) override {
    return at(peer)->post_from(peer, h, payload);
  }
  bool sent(int peer, std::uint64_t ticket) override { return at(peer)->sent(peer, ticket); }
  void detach() noexcept override {
    if (local_) local_->detach();
    if (remote_) remote_->detach();
  }
  bool sends_by_reference(int peer) const override { return at(peer)->sends_by_reference(peer); }
  void lend_any_memory(bool on) override {
    if (local_) local_->lend_any_memory(on);
    if (remote_) remote_->lend_any_memory(on);
  }
  // Staging is the local set's: a payload shared with a peer across hosts goes through slots.
  bool can_stream_slots(int peer) const override { return at(peer)->can_stream_slots(peer); }
  bool shares_copies(int peer) const override {
    return local_ && at(peer) == local_.get() && local_->shares_copies(peer);
  }
  std::uint64_t stage(const std::byte* payload, std::size_t bytes) override {
    return local_ ? local_->stage(payload, bytes) : 0;
  }
  void post_staged(int peer, const plait::detail::slot_header& h, std::uint64_t handle) override {
    at(peer)->post_staged(peer, h, handle);
  }
  slot_view peek(int peer) override { return at(peer)->peek(peer); }
  const std::byte* fetch(int peer) override { return at(peer)->fetch(peer); }
  bool receives_into_memory(int peer) const override { return at(peer)->receives_into_memory(peer); }
  expectation expect(int peer, std::size_t ahead, const plait::detail::slot_header& h, std::byte* dst) override {
    return at(peer)->expect(peer, ahead, h, dst);
  }
  bool receive_into(int peer, std::byte* dst, std::size_t bytes) override {
    return at(peer)->receive_into(peer, dst, bytes);
  }
  void release(int peer) override { at(peer)->release(peer); }
  void health(int peer) override { at(peer)->health(peer); }
  bool progress() noexcept override { return (local_ && local_->progress()) | (remote_ && remote_->progress()); }
  void release_io(bool leaving) noexcept override {
    if (local_) local_->release_io(leaving);
    if (remote_) remote_->release_io(leaving);
  }
  void close(close_reason why = {}) noexcept override {
    if (local_) local_->close(why);
    if (remote_) remote_->close(why);
  }

 private:
  link_set* at(int peer) const {
    return peer >= 0 && static_cast<std::size_t>(peer) < route_.size() ? route_[static_cast<std::size_t>(peer)]
                                                                       : nullptr;
  }
  std::unique_ptr<link_set> local_, remote_;
  std::vector<link_set*> route_;
};

}  // namespace detail_hybrid

template <transport_for Local, transport_for Remote>
struct hybrid {
  static constexpr transport_traits traits{.device_memory = Local::traits.device_memory && Remote::traits.device_memory,
                                           .one_sided = Local::traits.one_sided && Remote::traits.one_sided,
                                           .zero_copy = Local::traits.zero_copy && Remote::traits.zero_copy,
                                           .network = Local::traits.network || Remote::traits.network,
                                           .network_on_one_host = Local::traits.network,
                                           .shares_copies = Local::traits.shares_copies};
  static constexpr std::string_view name = "hybrid";

  static std::unique_ptr<link_set> connect(bootstrap_context& ctx, plait::detail::doorbell& bell,
                                           const link_config& cfg, std::span<const int> peers) {
    const auto deadline = clock::now() + cfg.connect_timeout;
    const std::string me = ctx.host_id();
    ctx.put("hybrid/host/" + std::to_string(ctx.rank()), std::as_bytes(std::span(me.data(), me.size())));
    std::vector<int> local, remote;
    for (int p : peers) {
      auto got = ctx.get("hybrid/host/" + std::to_string(p), deadline);
      const std::string host(reinterpret_cast<const char*>(got.data()), got.size());
      (host == me ? local : remote).push_back(p);
    }
    auto l = Local::connect(ctx, bell, cfg, std::span<const int>(local));
    auto r = Remote::connect(ctx, bell, cfg, std::span<const int>(remote));
    std::vector<link_set*> route(static_cast<std::size_t>(ctx.size()), nullptr);
    for (int p : local) route[static_cast<std::size_t>(p)] = l.get();
    for (int p : remote) route[static_cast<std::size_t>(p)] = r.get();
    return std::make_unique<detail_hybrid::links>(std::move(l), std::move(r), std::move(route));
  }
};

}  // namespace plait::transport
