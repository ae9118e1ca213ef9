// The collectives: all_reduce, all_gather, reduce_scatter, broadcast, reduce,
// all_to_all, send, recv, barrier — each blocking and _async (DESIGN.md section 4).
//
// Each call: check the communicator is not broken, take the next sequence number,
// validate its arguments on this rank (a misuse is invalid_argument here, and a
// notice in every peer's FIFO so they fail with mismatch instead of hanging), ask
// the algorithm for this rank's schedule, and run it through the executor with the
// fused kernel for (T, Op). The element type T is deduced from the output (or
// in-place) span; inputs are std::type_identity_t<std::span<const T>>. Algorithms
// that lack a collective are rejected at compile time by the requires clauses.
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include <plait/algorithm/direct.hpp>
#include <plait/algorithm/recursive_doubling.hpp>
#include <plait/algorithm/ring.hpp>
#include <plait/algorithm/tree.hpp>
#include <plait/communicator.hpp>
#include <plait/ops.hpp>
#include <plait/options.hpp>
#include <plait/request.hpp>
#include <plait/types.hpp>
#include <plait/kernel/reduce_copy.hpp>

namespace plait {

template <class A>
concept has_all_reduce = requires(const detail::schedule_params& p) {
  { A::all_reduce(p) } -> std::same_as<detail::schedule>;
};
template <class A>
concept has_all_gather = requires(const detail::schedule_params& p) {
  { A::all_gather(p) } -> std::same_as<detail::schedule>;
};
template <class A>
concept has_reduce_scatter = requires(const detail::schedule_params& p) {
  { A::reduce_scatter(p) } -> std::same_as<detail::schedule>;
};
template <class A>
concept has_broadcast = requires(const detail::schedule_params& p) {
  { A::broadcast(p) } -> std::same_as<detail::schedule>;
};
template <class A>
concept has_reduce = requires(const detail::schedule_params& p) {
  { A::reduce(p) } -> std::same_as<detail::schedule>;
};

namespace detail {

template <class T, class Op>
void kernel_entry(const void* op, const void* const* srcs, int nsrc, void* const* dsts, int ndst, std::size_t count,
                  int finalize_n) noexcept {
  const T* s[3] = {};
  T* d[3] = {};
  for (int i = 0; i < nsrc; ++i) s[i] = static_cast<const T*>(srcs[i]);
  for (int i = 0; i < ndst; ++i) d[i] = static_cast<T*>(dsts[i]);
  kernel::reduce_copy<T, Op>(*static_cast<const Op*>(op), std::span<const T* const>(s, static_cast<std::size_t>(nsrc)),
                             std::span<T* const>(d, static_cast<std::size_t>(ndst)), count, finalize_n);
}

inline bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) noexcept {
  if (an == 0 || bn == 0) return false;
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

// One call being set up: its description, checks and schedule.
template <class T, class Op>
struct call_builder {
  comm_core& core;
  std::unique_ptr<call> c = core.take_call();

  call_builder(comm_core& k, collective_kind kind, std::uint8_t algo, const Op& op, int root, std::size_t count,
               std::uint64_t sequence, call_options opt)
      : core(k) {
    core.throw_if_broken();
    static_assert(std::is_trivially_copyable_v<Op> && sizeof(Op) <= sizeof(call::op) && alignof(Op) <= 16,
                  "reduce ops must be small trivially copyable functors");
    c->desc.sequence = sequence;
    c->desc.kind = kind;
    c->desc.dtype = static_cast<std::uint8_t>(dtype_of<T>);
    c->desc.op = op_id_v<Op>;
    c->desc.algorithm = algo;
    c->desc.root = root;
    c->desc.count = count;
    const std::size_t shards = kind == collective_kind::all_gather ? static_cast<std::size_t>(core.size()) : 1;
    c->desc.slice_bytes = static_cast<std::uint32_t>(core.config().slice_for(kind, count * sizeof(T) * shards));
    c->elem_size = sizeof(T);
    c->kernel = &kernel_entry<T, Op>;
    std::memcpy(c->op, &op, sizeof(Op));
    c->finalize_n = core.size();
    c->timeout = core.timeout_for(opt.timeout);
  }

  void require(bool ok, const char* what) {
    if (!ok) core.reject(c->desc, std::string(to_string(c->desc.kind)) + ": " + what);
  }

  // Count checks shared by every collective: elements * sizeof(T) * n must fit.
  void require_count_fits(std::size_t elements_per_rank_block) {
    const auto n = static_cast<std::size_t>(core.size());
    const std::size_t limit = std::numeric_limits<std::size_t>::max() / sizeof(T) / n;
    require(elements_per_rank_block <= limit, "count overflows the address space (count * sizeof(T) * ranks)");
  }

  schedule_params sp(std::size_t count, int root = 0) const {
    schedule_params p;
    p.rank = core.rank();
    p.size = core.size();
    p.root = root;
    p.count = count;
    p.slice_elems = slice_elems();
    p.chain = core.config().chain;
    const std::size_t bytes =
        count * sizeof(T) * (c->desc.kind == collective_kind::reduce_scatter ? static_cast<std::size_t>(p.size) : 1);
    if (core.config().ring_follows_cpus(c->desc.kind, bytes)) p.cycle = core.config().cpu_ring;
    return p;
  }

  // The bytes at the call's input and at its output: an all_gather's output and a
  // reduce_scatter's input hold a block per rank.
  std::pair<std::size_t, std::size_t> extents() const {
    const std::size_t bytes = c->desc.count * c->elem_size, blocks = bytes * static_cast<std::size_t>(core.size());
    if (c->desc.kind == collective_kind::all_gather) return {bytes, blocks};
    if (c->desc.kind == collective_kind::reduce_scatter) return {blocks, bytes};
    return {bytes, bytes};
  }

  // This call's slice (comm_config::slice_for its kind and output), in elements.
  std::size_t slice_elems() const { return std::max<std::size_t>(1, c->desc.slice_bytes / sizeof(T)); }

  // What this call's schedule is made from (see comm_core::schedule_for).
  comm_core::schedule_key key(const schedule_params& p, int peer = -1, bool receiving = false) const {
    return {c->desc.kind, c->desc.algorithm, p.root, p.count, p.slice_elems, peer, receiving};
  }

  // Runs the call with the schedule `make` returns (an algorithm applied to the
  // parameters `key` was made from), or the one kept from an earlier call with the same key.
  template <class Make>
  void finish(const comm_core::schedule_key& k, Make&& make, const void* in, void* out, bool async, request* req) {
    const schedule& s = core.schedule_for(k, make);
    c->steps.assign(s.begin(), s.end());
    c->input = static_cast<const std::byte*>(in);
    c->output = static_cast<std::byte*>(out);
    const auto [in_bytes, out_bytes] = extents();
    core.back_by_huge_pages(in, in_bytes);
    if (out != in) core.back_by_huge_pages(out, out_bytes);
    if (async) {
      *req = core.submit(std::move(c));
    } else {
      core.run(std::move(c));
    }
  }
};

// The library's algorithms take ids 0-127; one written outside it (docs/algorithms.md,
// "Adding an algorithm") takes 128-255, so that its calls' fingerprints and cached
// schedules are its own and never taken for a built-in one's.
template <class Algo>
inline constexpr bool builtin_algorithm =
    std::is_same_v<Algo, automatic> || std::is_same_v<Algo, ring> || std::is_same_v<Algo, tree> ||
    std::is_same_v<Algo, direct> || std::is_same_v<Algo, recursive_doubling>;
template <class Algo>
constexpr void check_algorithm_id() {
  static_assert(builtin_algorithm<Algo> || Algo::id >= 128,
                "an algorithm defined outside plait takes an id of 128 or more (0-127 are the library's)");
}

// all_reduce_ranks: the communicator's size for all_reduce (which has the one-hop
// and log-hop algorithms), 0 for the other collectives; network: the transport's
// messages are costly (transport_traits::network); one_host: and every rank is on
// one host (comm_config::one_host).
template <class Algo>
std::uint8_t pick(std::size_t bytes, bool tree_capable, int all_reduce_ranks = 0, bool network = false,
                  bool one_host = false) {
  check_algorithm_id<Algo>();
  if constexpr (std::is_same_v<Algo, automatic>) {
    const int n = all_reduce_ranks;
    if (network && n >= 3 && tree_capable && (one_host || bytes <= automatic::network_tree_upto_bytes)) return tree::id;
    if (n > 1 && n <= direct::max_all_reduce_ranks && bytes < automatic::direct_below_bytes(n)) return direct::id;
    if (n > 3 && recursive_doubling::supports(n) && bytes < automatic::doubling_below_bytes(n))
      return recursive_doubling::id;
    return tree_capable && bytes < automatic::tree_below_bytes ? tree::id : ring::id;
  } else {
    return Algo::id;
  }
}

// all_gather and reduce_scatter: ring, direct (the same bytes; direct in one hop) or,
// for all_gather on 2^k ranks, recursive doubling (log2 n hops). `automatic` takes
// direct for small reduce_scatter only (automatic::scatter_direct_below_bytes), and
// not over a network transport; recursive doubling for all_gather on 4, 8, ... ranks
// over a network transport, or small (automatic::doubling_gather).
// Where every peer reads one staged copy (shares_copies), all_gather takes direct
// from automatic::gather_direct_from_bytes on 3 or more ranks; over a network
// transport with ranks sharing the CPUs they are bound to (comm_config::shared_cpus),
// from automatic::network_gather_direct_from_bytes.
template <class Algo>
std::uint8_t pick_exchange(collective_kind kind, std::size_t total_bytes, int ranks, bool network = false,
                           bool shares_copies = false, bool shared_cpus = false) {
  check_algorithm_id<Algo>();
  if constexpr (std::is_same_v<Algo, automatic>) {
    if (kind == collective_kind::all_gather && shares_copies && ranks >= 3 &&
        total_bytes >= automatic::gather_direct_from_bytes(ranks))
      return direct::id;
    if (kind == collective_kind::all_gather && network && shared_cpus && ranks >= 3 &&
        total_bytes >= automatic::network_gather_direct_from_bytes)
      return direct::id;
    if (kind == collective_kind::all_gather)
      return automatic::doubling_gather(ranks, network, total_bytes) ? recursive_doubling::id : ring::id;
    return kind == collective_kind::reduce_scatter && !network &&
                   total_bytes < automatic::scatter_direct_below_bytes(ranks)
               ? direct::id
               : ring::id;
  } else {
    return Algo::id;
  }
}

// broadcast: direct on 3 or more ranks where every peer reads one staged copy
// (automatic::broadcast_direct_from_bytes); the ring at every size where the
// communicator has a chain of ranks grouped by CPU (`chained`: comm_config::chain,
// ranks bound to shared CPUs, where the tree's small calls took 4x as long:
// docs/performance.md, "Oversubscribed ranks bound round robin"); else the tree below
// tree_below_bytes and the ring above.
template <class Algo>
std::uint8_t pick_broadcast(std::size_t bytes, int ranks, bool shares_copies = false, bool chained = false) {
  check_algorithm_id<Algo>();
  if constexpr (std::is_same_v<Algo, automatic>) {
    if (shares_copies && ranks >= 3 && bytes >= automatic::broadcast_direct_from_bytes) return direct::id;
    if (chained) return ring::id;
    return bytes < automatic::tree_below_bytes ? tree::id : ring::id;
  } else {
    return Algo::id;
  }
}

template <class Algo, class T, class Op>
request all_reduce_impl(comm_core& core, std::span<const T> in, std::span<T> out, Op op, call_options opt, bool async) {
  const std::uint8_t algo =
      pick<Algo>(out.size_bytes(), true, core.size(), core.config().network, core.config().one_host);
  call_builder<T, Op> b(core, collective_kind::all_reduce, algo, op, -1, out.size(), core.next_sequence(), opt);
  b.require(in.size() == out.size(), "input and output must have the same number of elements");
  b.require(in.data() == out.data() || !overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()),
            "input and output overlap without being the same buffer (use the in-place form)");
  b.require_count_fits(out.size());
  b.require(algo != direct::id || core.size() <= direct::max_all_reduce_ranks,
            "all_reduce<direct> is for 2 or 3 ranks (one exchange); use ring or tree");
  b.require(algo != recursive_doubling::id || recursive_doubling::supports(core.size()),
            "all_reduce<recursive_doubling> needs a power-of-two number of ranks; use ring or tree");
  auto p = b.sp(out.size());
  request r;
  b.finish(
      b.key(p),
      [&] {
        if constexpr (!std::is_same_v<Algo, automatic>)
          return Algo::all_reduce(p);
        else
          return algo == tree::id                 ? tree::all_reduce(p)
                 : algo == direct::id             ? direct::all_reduce(p)
                 : algo == recursive_doubling::id ? recursive_doubling::all_reduce(p)
                                                  : ring::all_reduce(p);
      },
      in.data(), out.data(), async, &r);
  return r;
}

}  // namespace detail

// ---- all_reduce --------------------------------------------------------------

template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&
    (std::same_as<Algo, automatic> ||
     has_all_reduce<Algo>)void all_reduce(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> in,
                                          std::span<T> out, Op op, call_options opt = {}) {
  detail::all_reduce_impl<Algo>(comm.core(), in, out, op, opt, false);
}

template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&(std::same_as<Algo, automatic> ||
                             has_all_reduce<Algo>)void all_reduce(communicator<Transport>& comm, std::span<T> buf,
                                                                  Op op, call_options opt = {}) {
  detail::all_reduce_impl<Algo>(comm.core(), std::span<const T>(buf), buf, op, opt, false);
}

template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&(std::same_as<Algo, automatic> || has_all_reduce<Algo>) [[nodiscard]] request
    all_reduce_async(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> in, std::span<T> out,
                     Op op, call_options opt = {}) {
  return detail::all_reduce_impl<Algo>(comm.core(), in, out, op, opt, true);
}

template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&(std::same_as<Algo, automatic> || has_all_reduce<Algo>) [[nodiscard]] request
    all_reduce_async(communicator<Transport>& comm, std::span<T> buf, Op op, call_options opt = {}) {
  return detail::all_reduce_impl<Algo>(comm.core(), std::span<const T>(buf), buf, op, opt, true);
}

}  // namespace plait

#include <plait/detail/collectives_more.hpp>
