// shm_all_reduce: the tensor-parallel sum for ranks on one host, through a shared-memory segment
// every rank has mapped (anycore/distributed/shm.py creates, maps and unlinks it; this file only
// reads and writes it). Portable C++ (x86-64 and Arm64): std::atomic acquire/release flags and
// plain loops, no intrinsics.
//
// Segment layout (kept in step with anycore/distributed/shm.py):
//   [0, 64)                          abort word (u64): non-zero = the group failed, stop at once
//   [64 + 128 r, 64 + 128 r + 64)    rank r's line: arrive generation (u64), pid (i64)
//   [128 + 128 r, 192 + 128 r)       rank r's depart generation (u64), its own cache line
//   [header, header + world * slot)  rank r's slot at header + r * slot; header = the lines
//                                    rounded up to 4096 bytes
//
// One round per slot-sized chunk of x: rank r copies its chunk into its slot, publishes
// arrive[r] = gen (release), waits until every arrive[j] >= gen (acquire), sums all slots in
// rank order (fp32 accumulation, so every rank computes the same bits in the same order), then
// publishes depart[r] = gen and waits for every depart[j] >= gen before its slot may be reused.
// gen is arrive[r] + 1: only rank r writes its own words, so the op keeps no state.
//
// A wait spins briefly, then yields; it fails (a RuntimeError, which the Python group turns
// into RankFailure) when the abort word is set, when a peer's process is gone, or after
// timeout_s.
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <signal.h>
#include <torch/library.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

namespace anycore::ops {
namespace {

constexpr int64_t kLine = 64;
constexpr int64_t kRankLines = 128;  // arrive line + depart line
constexpr int64_t kAlign = 4096;

int64_t header_bytes(int64_t world) {
  const int64_t raw = kLine + world * kRankLines;
  return (raw + kAlign - 1) / kAlign * kAlign;
}

struct Segment {
  uint8_t* base;
  int64_t world;
  int64_t slot_bytes;
  std::atomic<uint64_t>* abort_word() const { return reinterpret_cast<std::atomic<uint64_t>*>(base); }
  std::atomic<uint64_t>* arrive(int64_t r) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(base + kLine + r * kRankLines);
  }
  std::atomic<uint64_t>* depart(int64_t r) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(base + kLine + r * kRankLines + kLine);
  }
  int64_t pid(int64_t r) const {
    int64_t p;
    std::memcpy(&p, base + kLine + r * kRankLines + 8, sizeof p);
    return p;
  }
  uint8_t* slot(int64_t r) const { return base + header_bytes(world) + r * slot_bytes; }
};

bool process_gone(int64_t pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// Waits until every rank's flag (arrive or depart) reaches gen.
void wait_all(const Segment& s, bool departing, uint64_t gen, int64_t rank, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (int64_t j = 0; j < s.world; ++j) {
    std::atomic<uint64_t>* flag = departing ? s.depart(j) : s.arrive(j);
    for (int64_t spin = 0; flag->load(std::memory_order_acquire) < gen; ++spin) {
      if (spin < 256) continue;  // a peer a few microseconds behind: stay on the core
      std::this_thread::yield();
      if (spin % 64 != 0) continue;
      TORCH_CHECK(s.abort_word()->load(std::memory_order_relaxed) == 0, "shm all-reduce on rank ", rank,
                  ": the group was aborted");
      TORCH_CHECK(!process_gone(s.pid(j)), "shm all-reduce on rank ", rank, ": rank ", j, " (pid ", s.pid(j),
                  ") is gone");
      const double waited = std::chrono::duration<double>(clock::now() - start).count();
      TORCH_CHECK(waited < timeout_s, "shm all-reduce on rank ", rank, ": rank ", j, " did not arrive within ",
                  timeout_s, " s (hung)");
    }
  }
}

template <typename T>
void sum_slots(const Segment& s, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = static_cast<float>(reinterpret_cast<const T*>(s.slot(0))[i]);
    for (int64_t r = 1; r < s.world; ++r) acc += static_cast<float>(reinterpret_cast<const T*>(s.slot(r))[i]);
    out[i] = static_cast<T>(acc);
  }
}

void shm_all_reduce(at::Tensor x, at::Tensor segment, int64_t rank, int64_t world, double timeout_s) {
  TORCH_CHECK(x.is_contiguous(), "shm_all_reduce: x must be contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "shm_all_reduce: x must be float32 or bfloat16");
  TORCH_CHECK(segment.scalar_type() == at::kByte && segment.is_contiguous(), "shm_all_reduce: segment must be uint8");
  TORCH_CHECK(world >= 1 && rank >= 0 && rank < world, "shm_all_reduce: rank ", rank, " of ", world);
  const int64_t header = header_bytes(world);
  TORCH_CHECK(segment.numel() > header, "shm_all_reduce: segment too small");
  Segment s{segment.data_ptr<uint8_t>(), world, (segment.numel() - header) / world / kLine * kLine};
  TORCH_CHECK(reinterpret_cast<uintptr_t>(s.base) % kLine == 0, "shm_all_reduce: segment not 64-byte aligned");
  const int64_t elem = x.element_size();
  const int64_t chunk = s.slot_bytes / elem;
  TORCH_CHECK(chunk > 0, "shm_all_reduce: slot too small");
  uint8_t* data = static_cast<uint8_t*>(x.data_ptr());
  for (int64_t off = 0; off < x.numel(); off += chunk) {
    const int64_t n = std::min(chunk, x.numel() - off);
    const uint64_t gen = s.arrive(rank)->load(std::memory_order_relaxed) + 1;
    std::memcpy(s.slot(rank), data + off * elem, n * elem);
    s.arrive(rank)->store(gen, std::memory_order_release);
    wait_all(s, false, gen, rank, timeout_s);
    if (x.scalar_type() == at::kFloat) {
      sum_slots<float>(s, n, reinterpret_cast<float*>(data) + off);
    } else {
      sum_slots<c10::BFloat16>(s, n, reinterpret_cast<c10::BFloat16*>(data) + off);
    }
    s.depart(rank)->store(gen, std::memory_order_release);
    wait_all(s, true, gen, rank, timeout_s);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(anycore, m) {
  m.def("shm_all_reduce(Tensor(a!) x, Tensor(b!) segment, int rank, int world, float timeout_s) -> ()",
        &shm_all_reduce);
}

}  // namespace anycore::ops
