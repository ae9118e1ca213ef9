// Launch-environment detection (DESIGN.md section 5): who this rank is, how many
// ranks there are, where the store is, and which address to listen on.
//
// detect_launch() reads, in priority order (the first family with any of its rank or
// size variables set decides; the rest are ignored):
//   PLAIT     PLAIT_RANK, PLAIT_WORLD_SIZE, PLAIT_LOCAL_RANK       (plaitrun, by hand)
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK
//   Open MPI  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   PMI       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID                  (MPICH/Hydra)
//   Slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// The store is PLAIT_STORE (host:port), else MASTER_ADDR:(MASTER_PORT+1). With none of
// these variables the program is a world of one and needs no store. A partial or
// malformed environment (a rank without a size, more than one rank and no store
// address, a rank out of range, a non-number) is errc::invalid_argument naming the
// variable. A missing local rank reads as 0. Integers are parsed strictly (digits only).
// PLAIT_STORE_SERVED=1 (set by plaitrun) means the launcher serves the store, so rank 0
// must not. Everything here only reads the environment and the interfaces; no state.
#pragma once

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <plait/detail/socket.hpp>
#include <plait/error.hpp>

namespace plait::bootstrap {

struct launch_info {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::string store_host;
  std::uint16_t store_port = 0;
  bool store_served = false;  // PLAIT_STORE_SERVED=1: plaitrun serves the store, rank 0 must not
  std::string source;         // "PLAIT", "torchrun", "Open MPI", "PMI", "Slurm", "none"
};

namespace launch_detail {

inline const char* env(const char* name) { return std::getenv(name); }

inline long long parse_int(const char* name, const char* value, long long max) {
  std::string_view v(value);
  bool ok = !v.empty() && v.size() <= 19;
  long long n = 0;
  for (char c : v) {
    if (c < '0' || c > '9' || n > (max - (c - '0')) / 10) {  // not a digit, or past max (no overflow)
      ok = false;
      break;
    }
    n = n * 10 + (c - '0');
  }
  if (!ok || n > max)
    throw error(errc::invalid_argument, std::string(name) + "='" + std::string(v) +
                                            "' is not a valid number (expected digits only, at most " +
                                            std::to_string(max) + ")");
  return n;
}

struct family {
  const char* source;
  const char* rank;
  const char* size;
  const char* local;
};

inline constexpr family families[] = {
    {"PLAIT", "PLAIT_RANK", "PLAIT_WORLD_SIZE", "PLAIT_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

}  // namespace launch_detail

inline launch_info detect_launch() {
  using namespace launch_detail;
  launch_info info;
  info.source = "none";
  for (const family& f : families) {
    const char* r = env(f.rank);
    const char* s = env(f.size);
    if (!r && !s) continue;
    if (!r || !s)
      throw error(errc::invalid_argument, std::string(r ? f.size : f.rank) + " is not set, but " +
                                              (r ? f.rank : f.size) + " is (a " + f.source +
                                              " launch needs both); set it, or unset the other");
    info.source = f.source;
    info.size = static_cast<int>(parse_int(f.size, s, INT_MAX));
    if (info.size < 1) throw error(errc::invalid_argument, std::string(f.size) + "=0: a world needs at least one rank");
    info.rank = static_cast<int>(parse_int(f.rank, r, INT_MAX));
    if (info.rank >= info.size)
      throw error(errc::invalid_argument, std::string(f.rank) + "=" + r + " is out of range for " + f.size + "=" + s +
                                              " (ranks are 0.." + std::to_string(info.size - 1) + ")");
    if (const char* l = env(f.local)) {
      info.local_rank = static_cast<int>(parse_int(f.local, l, INT_MAX));
      if (info.local_rank >= info.size)
        throw error(errc::invalid_argument,
                    std::string(f.local) + "=" + l + " is out of range for " + f.size + "=" + s);
    }
    break;
  }

  if (const char* served = env("PLAIT_STORE_SERVED")) {
    std::string_view v(served);
    if (v != "0" && v != "1")
      throw error(errc::invalid_argument, "PLAIT_STORE_SERVED='" + std::string(v) + "' must be 0 or 1");
    info.store_served = v == "1";
  }

  if (const char* store = env("PLAIT_STORE")) {
    try {
      auto [host, port] = detail::parse_host_port(store);
      info.store_host = host;
      info.store_port = port;
    } catch (const error& e) {
      throw error(errc::invalid_argument, "PLAIT_STORE: " + e.message());
    }
    if (info.store_port == 0)
      throw error(errc::invalid_argument, std::string("PLAIT_STORE='") + store + "' has port 0; name the real port");
  } else if (const char* addr = env("MASTER_ADDR")) {
    const char* port = env("MASTER_PORT");
    if (!port)
      throw error(errc::invalid_argument,
                  "MASTER_ADDR is set but MASTER_PORT is not; plait's store listens on "
                  "MASTER_PORT+1, so set MASTER_PORT (or set PLAIT_STORE=host:port)");
    if (*addr == '\0') throw error(errc::invalid_argument, "MASTER_ADDR is set but empty");
    info.store_host = addr;
    info.store_port = static_cast<std::uint16_t>(parse_int("MASTER_PORT", port, 65534) + 1);
  } else if (info.size > 1 || info.store_served) {
    throw error(errc::invalid_argument,
                "PLAIT_STORE is not set (and neither are MASTER_ADDR/MASTER_PORT), but this " + info.source +
                    " launch has " + std::to_string(info.size) +
                    " ranks; set PLAIT_STORE=host:port to an address rank 0 can listen on, the same on every rank");
  }
  return info;
}

// PLAIT_HOST_ID, else the host name: ranks with equal identities share memory.
inline std::string host_identity() {
  if (const char* id = std::getenv("PLAIT_HOST_ID"); id && *id) return id;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0)
    throw error(errc::system, "gethostname failed: " + detail::errno_text(errno) + "; set PLAIT_HOST_ID");
  return name;
}

namespace launch_detail {

struct ifaddrs_list {
  ifaddrs* head = nullptr;
  ifaddrs_list() {
    if (::getifaddrs(&head) != 0) throw error(errc::system, "getifaddrs failed: " + detail::errno_text(errno));
  }
  ifaddrs_list(const ifaddrs_list&) = delete;
  ifaddrs_list& operator=(const ifaddrs_list&) = delete;
  ~ifaddrs_list() {
    if (head) ::freeifaddrs(head);
  }
};

inline std::string sockaddr_text(const sockaddr* sa) {
  sockaddr_storage ss{};
  std::memcpy(&ss, sa, sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  return detail::address_text(ss);
}

}  // namespace launch_detail

// The IPv4 address of interface ifname (else its first non-link-local IPv6 address).
inline std::string interface_address(const std::string& ifname) {
  launch_detail::ifaddrs_list list;
  std::string v6, names = " ";
  bool seen = false;
  for (ifaddrs* i = list.head; i; i = i->ifa_next) {
    if (!i->ifa_name) continue;
    if (ifname != i->ifa_name) {
      // Built by append: GCC 12 at -O3 warns falsely (-Wrestrict) on " " + std::string(...).
      std::string listed = " ";
      listed.append(i->ifa_name).append(" ");
      if (names.find(listed) == std::string::npos) names.append(listed, 1, std::string::npos);
      continue;
    }
    seen = true;
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET) return launch_detail::sockaddr_text(i->ifa_addr);
    if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr)) v6 = launch_detail::sockaddr_text(i->ifa_addr);
    }
  }
  if (!v6.empty()) return v6;
  if (seen) throw error(errc::invalid_argument, "PLAIT_IFNAME=" + ifname + " has no usable IP address");
  throw error(errc::invalid_argument, "PLAIT_IFNAME=" + ifname + " is not an interface of this host (it has:" + names +
                                          "); name one of those or set PLAIT_ADDR");
}

// True when host names an address of this machine (loopback included).
inline bool is_local_address(const std::string& host) {
  if (host.empty() || host == "0.0.0.0" || host == "::" || detail::is_loopback_address(host)) return true;
  detail::addrinfo_list resolved;
  try {
    if (!detail::resolve(host, 0, false, resolved)) return false;
  } catch (const error&) {
    return false;
  }
  launch_detail::ifaddrs_list list;
  for (addrinfo* ai = resolved.head; ai; ai = ai->ai_next) {
    std::string text = launch_detail::sockaddr_text(ai->ai_addr);
    for (ifaddrs* i = list.head; i; i = i->ifa_next)
      if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6) &&
          launch_detail::sockaddr_text(i->ifa_addr) == text)
        return true;
  }
  return false;
}

// The address this rank listens on for peer connections: PLAIT_ADDR, else the address
// of PLAIT_IFNAME, else 127.0.0.1 when the store is on loopback (the whole job is),
// else the local address of the store connection (the interface that reaches it).
inline std::string listen_address_for(const std::string& store_host, const std::string& store_local_address) {
  if (const char* a = std::getenv("PLAIT_ADDR")) {
    if (*a == '\0') throw error(errc::invalid_argument, "PLAIT_ADDR is set but empty; set an address or unset it");
    return a;
  }
  if (const char* ifname = std::getenv("PLAIT_IFNAME")) {
    if (*ifname == '\0')
      throw error(errc::invalid_argument, "PLAIT_IFNAME is set but empty; name an interface or unset it");
    return interface_address(ifname);
  }
  if (store_host.empty() || detail::is_loopback_address(store_host)) return "127.0.0.1";
  return store_local_address.empty() ? "127.0.0.1" : store_local_address;
}

}  // namespace plait::bootstrap
