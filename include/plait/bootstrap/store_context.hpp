// store_context: the bootstrap_context (transport.hpp) over the TCP store, and
// join_world(), which turns the launch environment into a connected store client.
//
// All keys of a store_context are prefixed by its scope (e.g. "c3/"), so communicators
// sharing a store never see each other's keys. put() is bounded by the context's
// operation timeout (PLAIT_TIMEOUT, default 600 s); get() and barrier() by the
// caller's deadline. barrier() names the ranks that have not arrived when it times
// out. A world of one rank has no store: its context keeps keys in memory.
// A store_context is used by one thread at a time (the communicator's setup); the
// store_client behind it is thread-safe and shared.
//
// join_world(deadline): detect_launch(), resolve_token(), then on rank 0 of a world
// of more than one rank (unless PLAIT_STORE_SERVED=1) start a store_server on the store
// address (or on 0.0.0.0 when that address is not one of this host's), and connect a
// client, retrying until the deadline. Servers live in a process-wide registry until
// exit, because other ranks may still use the store after rank 0's communicator is gone;
// at exit the registry waits (up to 10 s) for the other ranks to disconnect. A later
// join_world in the same process reuses the server for the same address.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <openssl/crypto.h>

#include <plait/bootstrap/launch.hpp>
#include <plait/bootstrap/store.hpp>
#include <plait/bootstrap/token.hpp>
#include <plait/detail/env.hpp>
#include <plait/transport.hpp>

namespace plait::bootstrap {

inline std::chrono::nanoseconds default_store_timeout() {
  return detail::env_seconds("PLAIT_TIMEOUT").value_or(std::chrono::seconds(600));
}

class store_context final : public bootstrap_context {
 public:
  // client may be null only for a world of one rank.
  store_context(std::shared_ptr<store_client> client, launch_info info, std::vector<std::byte> token,
                std::string host_id, std::string listen_address, std::string scope,
                std::chrono::nanoseconds op_timeout = default_store_timeout())
      : client_(std::move(client)),
        info_(std::move(info)),
        token_(std::move(token)),
        host_id_(std::move(host_id)),
        listen_address_(std::move(listen_address)),
        scope_(std::move(scope)),
        op_timeout_(op_timeout) {
    if (!client_ && info_.size != 1)
      throw error(errc::invalid_argument,
                  "a store_context for " + std::to_string(info_.size) + " ranks needs a store client", info_.rank);
    if (!client_) job_key_ = "plait" + generate_token_hex().substr(0, 16) + "_" + sanitize(scope_);
  }

  int rank() const override { return info_.rank; }
  int size() const override { return info_.size; }

  void put(std::string_view key, std::span<const std::byte> value) override {
    if (!client_) {
      local_[scoped(key)] = std::vector<std::byte>(value.begin(), value.end());
      return;
    }
    client_->set(scoped(key), value, clock::now() + op_timeout_);
  }

  std::vector<std::byte> get(std::string_view key, clock::time_point deadline) override {
    if (!client_) {
      auto it = local_.find(scoped(key));
      if (it == local_.end())
        throw error(errc::timeout, "key '" + scoped(key) + "' was never published (world of one rank)", info_.rank);
      return it->second;
    }
    try {
      return client_->get(scoped(key), deadline);
    } catch (const error& e) {
      throw error(e.code(), e.message(), info_.rank);
    }
  }

  std::optional<std::vector<std::byte>> try_get(std::string_view key) override {
    if (!client_) {
      auto it = local_.find(scoped(key));
      if (it == local_.end()) return std::nullopt;
      return it->second;
    }
    try {
      return client_->try_get(scoped(key), clock::now() + op_timeout_);
    } catch (const error& e) {
      throw error(e.code(), e.message(), info_.rank);
    }
  }

  void barrier(std::string_view name, clock::time_point deadline) override {
    if (!client_) return;
    // Each use of a name is its own round, so a name may be reused.
    const std::uint64_t round = rounds_[std::string(name)]++;
    const std::string base = round_key(name, round);
    const std::byte one{1};
    const auto put_deadline = std::min(deadline, clock::now() + op_timeout_);
    try {
      client_->set(base + "/" + std::to_string(info_.rank), std::span(&one, 1), put_deadline);
      if (client_->add(base + "/count", 1, put_deadline) == info_.size) {
        // The last to arrive releases the others; it need not wait itself.
        client_->set(base + "/done", std::span(&one, 1), put_deadline);
        // Every rank has left the previous round (all arrived at this one): drop its keys.
        if (round > 0) erase_round(round_key(name, round - 1), put_deadline);
        return;
      }
      client_->get(base + "/done", deadline);
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw error(e.code(), e.message(), info_.rank);
      throw error(errc::timeout, "barrier '" + std::string(name) + "' timed out; " + missing_ranks(base), info_.rank);
    }
  }

  std::span<const std::byte> token() const override { return token_; }
  std::string host_id() const override { return host_id_; }
  std::string listen_address() const override { return listen_address_; }

  // "plait<16 hex digits of the store's instance id>_<scope as [A-Za-z0-9_]>":
  // unique per job (each store instance draws a random id) and per scope.
  std::string job_key() const override {
    std::lock_guard lock(job_key_mu_);
    if (job_key_.empty()) {
      auto id = client_->get(store_protocol::instance_key, clock::now() + op_timeout_);
      std::string hex(reinterpret_cast<const char*>(id.data()), id.size());
      job_key_ = "plait" + sanitize(hex.substr(0, 16)) + "_" + sanitize(scope_);
    }
    return job_key_;
  }

  const std::string& scope() const { return scope_; }
  const launch_info& info() const { return info_; }

 private:
  std::string scoped(std::string_view key) const { return scope_ + std::string(key); }
  std::string round_key(std::string_view name, std::uint64_t round) const {
    return scope_ + "barrier/" + std::string(name) + "#" + std::to_string(round);
  }

  void erase_round(const std::string& base, clock::time_point deadline) {
    for (int r = 0; r < info_.size; ++r) client_->del(base + "/" + std::to_string(r), deadline);
    client_->del(base + "/count", deadline);
    client_->del(base + "/done", deadline);
  }

  // "ranks 2, 5 have not arrived" (best effort, within a couple of seconds).
  std::string missing_ranks(const std::string& base) const {
    std::string list;
    int missing = 0;
    try {
      auto until = clock::now() + std::chrono::seconds(2);
      for (int r = 0; r < info_.size; ++r) {
        if (client_->try_get(base + "/" + std::to_string(r), until)) continue;
        if (++missing <= 32) list += (list.empty() ? "" : ", ") + std::to_string(r);
      }
    } catch (const error&) {
      return "the store could not say which ranks are missing";
    }
    if (missing == 0) return "every rank arrived, but the completion was not seen in time";
    if (missing > 32) list += ", ... (" + std::to_string(missing) + " in all)";
    return (missing == 1 ? "rank " : "ranks ") + list + (missing == 1 ? " has" : " have") +
           " not arrived (stopped, crashed, or making different calls)";
  }

  static std::string sanitize(const std::string& s) {
    std::string out;
    for (char c : s) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      out += ok ? c : '_';
    }
    if (out.size() > 48) {  // keep shm names short; a hash keeps them distinct
      static constexpr char hex[] = "0123456789abcdef";
      std::size_t h = std::hash<std::string>{}(s);
      out.resize(32);
      for (int i = 0; i < 16; ++i) out += hex[(h >> (4 * i)) & 15];
    }
    return out;
  }

  std::shared_ptr<store_client> client_;
  launch_info info_;
  std::vector<std::byte> token_;
  std::string host_id_;
  std::string listen_address_;
  std::string scope_;
  std::chrono::nanoseconds op_timeout_;
  std::map<std::string, std::vector<std::byte>, std::less<>> local_;
  std::map<std::string, std::uint64_t, std::less<>> rounds_;
  mutable std::mutex job_key_mu_;
  mutable std::string job_key_;
};

struct world {
  std::shared_ptr<store_server> server;  // set on the rank that serves the store
  std::shared_ptr<store_client> client;  // null for a world of one
  launch_info info;
  std::vector<std::byte> token;
};

namespace context_detail {

// How long a process that serves the store waits at exit for the other ranks to
// disconnect from it (they may still be reading the last barrier's reply).
inline constexpr std::chrono::seconds store_linger{10};

// Store servers started by this process, kept until exit; at exit each waits (up to
// store_linger) for its clients to go before it stops.
struct server_registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<store_server>> servers;
  ~server_registry() {
    for (auto& [where, server] : servers)
      if (!server->drain(store_linger))
        detail::log(detail::log_level::warn, "store at ", where, ": ", server->connections(),
                    " clients still connected at exit; stopping it anyway");
  }
};

inline std::shared_ptr<store_server> serve_store(const launch_info& info, const std::vector<std::byte>& token) {
  // Exit handlers run in reverse order of registration. libcrypto registers its own
  // (OPENSSL_cleanup) on its first real initialisation, which is here, before the
  // registry's: so it runs after the registry's destructor, whose draining servers
  // still authenticate clients and whose threads' libcrypto state is freed only while
  // libcrypto is up. (OPENSSL_init_crypto(0, ...) would do nothing: LOAD_CONFIG is the
  // initialisation libcrypto's first use does anyway.)
  [[maybe_unused]] static const bool crypto_initialized = OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr) == 1;
  static server_registry registry;
  std::lock_guard lock(registry.mu);
  auto& servers = registry.servers;
  std::string where = detail::join_host_port(info.store_host, info.store_port);
  if (auto it = servers.find(where); it != servers.end()) return it->second;
  std::string bind = is_local_address(info.store_host) ? info.store_host : std::string("0.0.0.0");
  std::shared_ptr<store_server> server;
  try {
    server = std::make_shared<store_server>(bind, info.store_port, token);
  } catch (const error& e) {
    throw error(e.code(),
                "rank 0 cannot serve the store at " + where + ": " + e.message() +
                    " (the store address comes from PLAIT_STORE, else MASTER_ADDR:MASTER_PORT+1)",
                info.rank);
  }
  servers.emplace(where, server);
  return server;
}

}  // namespace context_detail

inline world join_world(clock::time_point deadline) {
  world w;
  w.info = detect_launch();
  detail::set_log_rank(w.info.rank);
  if (w.info.size == 1) {
    auto hex = generate_token_hex();
    w.token.assign(reinterpret_cast<const std::byte*>(hex.data()),
                   reinterpret_cast<const std::byte*>(hex.data()) + hex.size());
    return w;
  }
  w.token = resolve_token(w.info.store_host);
  if (w.info.rank == 0 && !w.info.store_served) w.server = context_detail::serve_store(w.info, w.token);
  try {
    w.client = std::make_shared<store_client>(w.info.store_host, w.info.store_port, w.token, deadline);
  } catch (const error& e) {
    throw error(e.code(), e.message(), w.info.rank);
  }
  detail::log(detail::log_level::info, "joined a world of ", w.info.size, " ranks (", w.info.source,
              ") through the store at ", detail::join_host_port(w.info.store_host, w.info.store_port));
  return w;
}

inline std::unique_ptr<store_context> make_context(const world& w, std::string scope) {
  std::string listen = listen_address_for(w.info.store_host, w.client ? w.client->local_address() : std::string());
  return std::make_unique<store_context>(w.client, w.info, w.token, host_identity(), std::move(listen),
                                         std::move(scope));
}

}  // namespace plait::bootstrap
