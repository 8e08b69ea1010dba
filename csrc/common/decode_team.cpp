// Batch-1 decode (bf16 activations; bf16 or W8A8 weights) through every layer in one OpenMP team.
//
// Why: at one token a SmolLM2 layer is four GEMVs (7 MB of bf16 weights, ~300 us) and a handful
// of small ops. Run op by op (decoder_layer.cpp's run_layer), every GEMV and the attention open and join
// their own parallel region and allocate their outputs, and the small ops run on one thread
// while the others wait. Here the threads enter once per step. They take chunks of every GEMV's
// rows on demand (whole 4-row blocks of the GEMV kernel, or 16-column panels of a packed int8
// weight) and a fixed share of the KV heads, and meet only where data crosses threads, five
// barriers a layer:
//   1. input norm: every thread computes it, into its own buffer (cheaper than a barrier); QKV rows
//   2. RoPE, K/V into the pool and attention, for the thread's own KV heads
//   3. O rows
//   4. residual add + norm (every thread again); the gate and up rows of a chunk of the
//      intermediate size, then SiLU-and-mul of that chunk (no barrier between: same thread)
//   5. down rows
// A W8A8 projection's activation row is quantized by every thread into its own workspace.
//
// Invariant: the same kernels on the same values as decoder_stack's op-by-op path (each row,
// head and element is computed by the same code with the same inputs; int8 accumulation is
// exact whatever the panel split), so the results are bit-identical;
// tests/kernels/test_decode_team.py compares them.
#include <omp.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "decoder_layout.h"
#include "ops.h"

namespace anycore::ops {
namespace {

// [begin, end) of thread t's share of n items, cut in whole groups of `unit` items.
struct Slice {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};

Slice share(int64_t n, int64_t unit, int64_t t, int64_t nt) {
  const int64_t groups = (n + unit - 1) / unit, per = (groups + nt - 1) / nt;
  return {std::min(n, t * per * unit), std::min(n, (t + 1) * per * unit)};
}

constexpr int64_t kGemvBlock = 4;    // rows per block of linear_kernel (gemv_kernels.h)
constexpr int64_t kInt8Panel = 16;   // output columns per panel of a packed int8 weight (int8_impl.h)
constexpr int64_t kGgufUnit = 16;    // GGUF weight rows a chunk is made of (any multiple of 1 works)
constexpr int64_t kMinChunk = 64;    // rows of the smallest chunk a thread takes (see Chunks)

// Rows handed out on demand, in shrinking chunks ("guided"): each chunk is 1/nt of what is left,
// at least kMinChunk rows, in whole units (GEMV blocks or int8 panels); the first chunk is the
// largest. Static halves left one thread waiting ~10 us at most barriers (two cores never stream
// at the same speed on a shared host); with chunks the threads finish within a small chunk of
// each other. But every chunk restarts a weight stream (the prefetchers ramp up again), so the
// chunks are as large as that allows: 1/nt and 64 rows decoded SmolLM2-135M 3-5% (bf16) and
// 4-8% (W8A8) faster than 1/(2 nt) and 16 rows (paired A/B rounds in one process).
struct Chunks {
  std::vector<int64_t> bounds;  // chunk c is rows [bounds[c], bounds[c + 1])

  Chunks(int64_t n, int64_t nt, int64_t unit) {
    const int64_t min_rows = (std::max(kMinChunk, unit) + unit - 1) / unit * unit;
    bounds.push_back(0);
    for (int64_t b = 0; b < n;) {
      const int64_t size = (n - b) / nt / unit * unit;
      b = std::min(n, b + std::max(size, min_rows));
      bounds.push_back(b);
    }
  }
  int64_t count() const { return static_cast<int64_t>(bounds.size()) - 1; }
};

// One counter per (layer, GEMV): the next chunk to take. Fresh counters each step, so no reset
// has to be ordered against the threads still reading the previous value.
struct alignas(64) Ticket {
  std::atomic<int64_t> next{0};
};

// f(rows) for every chunk this thread takes from `ticket`
template <typename F>
inline void take_chunks(Ticket& ticket, const Chunks& chunks, const F& f) {
  for (int64_t c; (c = ticket.next.fetch_add(1, std::memory_order_relaxed)) < chunks.count();)
    f(Slice{chunks.bounds[c], chunks.bounds[c + 1]});
}

// One projection of one activation row, as the op-by-op path runs it: the native bf16 GEMV, or
// W8A8 (the row quantized once per thread into its workspace, then any split of the packed
// weight's panels). Pointers are checked before the team starts: nothing may throw inside it.
struct Proj {
  int64_t n = 0, k = 0;
  LinearFn dense = nullptr;  // bf16
  const bf16* w = nullptr;
  const bf16* bias = nullptr;
  const Int8Kernels* i8 = nullptr;  // W8A8
  const void* packed = nullptr;
  const float* w_scale = nullptr;
  const float* bias_f = nullptr;  // W8A8 and GGUF
  const GgufKernels* gg = nullptr;  // GGUF blocks (packed: the blocks)
  int qtype = 0;

  int64_t unit() const { return i8 ? kInt8Panel : gg ? kGgufUnit : kGemvBlock; }  // rows a chunk is made of
  bool at_own_index() const { return i8 || gg; }  // run() writes row j at out[j] (not dense's dst)

  GgufArgs gguf_args(const bf16* x, bf16* out, void* ws) const {
    GgufArgs a{};
    a.x = x, a.x_stride = k, a.x_type = 1;
    a.w = static_cast<const uint8_t*>(packed), a.qtype = qtype, a.bias = bias_f;
    a.out = out, a.out_type = 1;
    a.m = 1, a.n = n, a.k = k;
    a.workspace = ws;
    return a;
  }

  W8A8Args args(const bf16* x, bf16* out, void* ws) const {
    W8A8Args a{};
    a.x = x, a.x_stride = k, a.x_type = kInt8Bf16;
    a.w = packed, a.w_scale = w_scale, a.bias = bias_f;
    a.out = out, a.out_type = kInt8Bf16;
    a.m = 1, a.n = n, a.k = k;
    a.workspace = ws;
    return a;
  }
  // W8A8: x quantized into this thread's workspace (before the thread's first chunk of x)
  void prepare(const bf16* x, void* ws) const {
    if (i8) i8->quantize_row(args(x, nullptr, ws));
    if (gg) gg->quantize_rows(gguf_args(x, nullptr, ws));
  }
  // rows [r.begin, r.end) of out = x W^T (+ bias), each at its own index
  void run(const bf16* x, bf16* out, void* ws, Slice r) const {
    if (r.size() <= 0) return;
    if (i8) {
      i8->gemm_panels(args(x, out, ws), r.begin / kInt8Panel, (r.end + kInt8Panel - 1) / kInt8Panel);
    } else if (gg) {
      gg->gemv_rows(gguf_args(x, out, ws), r.begin, r.end);
    } else {
      run_dense(x, out + r.begin, r);
    }
  }
  // dense only: rows [r.begin, r.end) to dst[0, r.size())
  void run_dense(const bf16* x, bf16* dst, Slice r) const {
    if (r.size() > 0) dense(dst, x, k, w + r.begin * k, bias ? bias + r.begin : nullptr, 1, r.size(), k);
  }
};

struct LayerPtrs {
  const bf16 *input_norm, *post_norm, *q_norm, *k_norm;  // q/k norm null when absent
  Proj qkv, o, gate_up, down;
};

const bf16* bf16_ptr(const at::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }

// The layer's pointers, or false when it cannot run in the team (not bf16, a dense projection
// off the native GEMV, a sparse MLP, q/k norms over the whole projection): decoder_stack then
// runs its layers one by one. fp32 copies of W8A8 scales
// and biases that are stored otherwise go to `keep` (alive for the step).
bool layer_ptrs(const Weights& w, int64_t w0, const int64_t* lin, int64_t hidden, int64_t q_size,
                int64_t kv_size, int64_t head_dim, std::vector<at::Tensor>& keep, LayerPtrs& out) {
  auto get = [&](int64_t i) -> std::optional<at::Tensor> {
    std::optional<at::Tensor> t = w.get(w0 + i);
    return t.has_value() && t->defined() ? t : std::nullopt;
  };
  auto vec = [&](int64_t i, int64_t n, const bf16*& p) {
    auto t = get(i);
    if (!t) return false;
    p = bf16_ptr(*t);
    return t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->numel() == n;
  };
  auto fp32 = [&](const at::Tensor& t) {
    keep.push_back(t.to(at::kFloat).contiguous());
    return keep.back().data_ptr<float>();
  };
  // n = 0: the width comes from the weight (gate_up); returns the projection's n, or 0 if unfit
  auto proj = [&](int64_t first, int64_t impl, int64_t n, int64_t k, Proj& g) -> int64_t {
    auto wt = get(first), scale = get(first + 1), bias = get(first + 2);
    if (!wt || impl < 0) return 0;
    g = Proj{};
    g.k = k;
    if (wt->scalar_type() == at::kByte) {  // GGUF blocks; the scale slot holds the block type
      if (!scale || scale->numel() != 1 || !wt->is_contiguous() || wt->dim() != 2) return 0;
      g.qtype = static_cast<int>(scale->item<int64_t>());
      const int64_t bb = gguf_block_bytes(g.qtype);
      g.n = n > 0 ? n : wt->size(0);
      if (bb == 0 || k % gguf_block_elems(g.qtype) != 0 || wt->size(0) != g.n ||
          wt->size(1) != gguf_row_bytes(g.qtype, k) || (gguf_is_x16(g.qtype) && g.n % kGgufX16Rows != 0) ||
          (bias && bias->numel() != g.n))
        return 0;
      g.gg = &gguf_table(impl);
      g.packed = wt->data_ptr(), g.bias_f = bias ? fp32(*bias) : nullptr;
      return g.n;
    }
    if (scale) {  // W8A8: packed int8 weight in variant impl's layout, fp32 scales per channel
      g.n = n > 0 ? n : scale->numel();
      g.i8 = &int8_table(impl);
      if (wt->scalar_type() != at::kChar || !wt->is_contiguous() || wt->numel() != g.i8->packed_bytes(g.n, k) ||
          scale->numel() != g.n || g.i8->quantize_row == nullptr || g.i8->gemm_panels == nullptr ||
          (bias && bias->numel() != g.n))
        return 0;
      g.packed = wt->data_ptr(), g.w_scale = fp32(*scale), g.bias_f = bias ? fp32(*bias) : nullptr;
      return g.n;
    }
    g.n = n > 0 ? n : (wt->dim() == 2 ? wt->size(0) : 0);
    if (wt->scalar_type() != at::kBFloat16 || !wt->is_contiguous() || wt->dim() != 2 || wt->size(0) != g.n ||
        wt->size(1) != k)
      return 0;
    if (bias && (bias->scalar_type() != at::kBFloat16 || !bias->is_contiguous() || bias->numel() != g.n)) return 0;
    g.dense = table(impl).linear[1], g.w = bf16_ptr(*wt), g.bias = bias ? bf16_ptr(*bias) : nullptr;
    return g.dense ? g.n : 0;
  };
  if (get(kRouter)) return false;  // a sparse MLP: its experts run in fused_moe's own call
  if (get(kClipQkv)) return false;  // (clamped q/k/v: the stack's layer-by-layer path)
  out.q_norm = out.k_norm = nullptr;
  if (get(kQNorm) && !(vec(kQNorm, head_dim, out.q_norm) && vec(kKNorm, head_dim, out.k_norm))) return false;
  if (!(vec(kInputNorm, hidden, out.input_norm) && vec(kPostNorm, hidden, out.post_norm) &&
        proj(kQkv, lin[kLinQkv], q_size + 2 * kv_size, hidden, out.qkv) && proj(kO, lin[kLinO], hidden, q_size, out.o)))
    return false;
  const int64_t two_inter = proj(kGateUp, lin[kLinGateUp], 0, hidden, out.gate_up);
  // gate and up rows of one slice must start whole units (panels): the SiLU pairs them per thread
  if (two_inter == 0 || two_inter % (2 * out.gate_up.unit()) != 0) return false;
  return proj(kDown, lin[kLinDown], hidden, two_inter / 2, out.down) != 0;
}

}  // namespace

// Every layer's pointers, derived once per StackWeights and geometry (checking and resolving the
// 480 tensors of SmolLM2 cost ~75 us a step with the caches cold from the weight stream).
// Valid as long as the StackWeights: whatever replaces a weight's storage (a new method, the
// weight arena) bumps Linear.generation in Python, which makes a new StackWeights.
struct TeamPlan {
  int64_t num_layers, hidden, q_size, kv_size, head_dim;  // the geometry it was derived for
  bool fit = false;                                       // false: run op by op
  std::vector<LayerPtrs> layers;
  std::vector<at::Tensor> keep;  // fp32 copies of scales/biases the layers point at
};

namespace {

const TeamPlan& team_plan(const StackWeights& stack, int64_t layers, int64_t hid, int64_t q_size, int64_t kv_size,
                          int64_t D) {
  std::shared_ptr<TeamPlan>& cached = stack.team_plan;
  if (cached && cached->num_layers == layers && cached->hidden == hid && cached->q_size == q_size &&
      cached->kv_size == kv_size && cached->head_dim == D)
    return *cached;
  auto plan = std::make_shared<TeamPlan>();
  plan->num_layers = layers, plan->hidden = hid, plan->q_size = q_size, plan->kv_size = kv_size, plan->head_dim = D;
  std::vector<LayerPtrs>& lp = plan->layers;
  lp.resize(layers);
  plan->fit = true;
  for (int64_t l = 0; l < layers && plan->fit; ++l) {
    plan->fit = layer_ptrs(stack.weights, l * kNumWeights, stack.linear_impls.data() + l * kNumLinears, hid, q_size,
                           kv_size, D, plan->keep, lp[l]);
    // one chunking per projection for all layers: the same widths and kinds everywhere
    const LayerPtrs &a = lp[l], &b = lp[0];
    plan->fit = plan->fit && a.gate_up.n == b.gate_up.n && a.qkv.unit() == b.qkv.unit() &&
                a.o.unit() == b.o.unit() && a.gate_up.unit() == b.gate_up.unit() && a.down.unit() == b.down.unit() &&
                (a.q_norm == nullptr) == (b.q_norm == nullptr);
  }
  cached = plan;
  return *cached;
}

std::atomic<int64_t> g_team_steps{0};

// ANYCORE_DECODE_TEAM=0 sends every step op by op (A/B benchmarks, tests); read per call so a
// process can switch.
bool switched_off() {
  const char* v = std::getenv("ANYCORE_DECODE_TEAM");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

int64_t decode_team_steps() { return g_team_steps.load(); }

std::optional<std::tuple<at::Tensor, at::Tensor>> decode_team(
    const at::Tensor& hidden, const StackWeights& stack, const at::Tensor& k_pool, const at::Tensor& v_pool,
    const at::Tensor& slot_mapping, const at::Tensor& cos_in, const at::Tensor& sin_in, const at::Tensor& q_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_table, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, double eps_d, double scale) {
  const std::vector<int64_t>& op_impls = stack.op_impls;
  const int64_t H = num_heads, KV = num_kv_heads, D = head_dim, layers = k_pool.size(0);
  if (switched_off() || hidden.dim() != 2 || hidden.size(0) != 1 || hidden.scalar_type() != at::kBFloat16 ||
      !hidden.is_contiguous() || seq_lens.numel() != 1 || k_pool.scalar_type() != at::kBFloat16 ||
      v_pool.scalar_type() != at::kBFloat16 || KV <= 0 || H % KV != 0 || D % 2 != 0 || D > kMaxHeadDim || H / KV > kMaxAttnRows || k_pool.size(2) != KV ||
      k_pool.size(3) != D || v_pool.sizes() != k_pool.sizes() || k_pool.stride(2) != D || k_pool.stride(3) != 1 ||
      v_pool.stride(2) != D || v_pool.stride(3) != 1)
    return std::nullopt;
  const int64_t hid = hidden.size(1), q_size = H * D, kv_size = KV * D, group = H / KV;
  const TeamPlan& plan = team_plan(stack, layers, hid, q_size, kv_size, D);
  if (!plan.fit) return std::nullopt;
  const std::vector<LayerPtrs>& lp = plan.layers;
  const int64_t inter = lp[0].gate_up.n / 2;

  // step inputs, converted and checked once (as paged_attention and decoder_stack do)
  at::Tensor slot_t = slot_mapping.to(at::kLong).contiguous();
  at::Tensor cos = cos_in.to(at::kFloat).contiguous(), sin = sin_in.to(at::kFloat).contiguous();
  at::Tensor starts = q_start_loc.to(at::kLong).contiguous(), lens = seq_lens.to(at::kLong).contiguous();
  at::Tensor slots_tab = slot_table.to(at::kLong).contiguous();
  TORCH_CHECK(slot_t.numel() == 1 && cos.numel() == D && sin.numel() == D, "decode step: bad slot_mapping or cos/sin");
  const int64_t slot = slot_t.data_ptr<int64_t>()[0], seq_len = lens.data_ptr<int64_t>()[0];
  TORCH_CHECK(slot >= 0 && slot < k_pool.size(1), "slot ", slot, " outside the KV pool");
  TORCH_CHECK(starts.numel() == 2 && starts.data_ptr<int64_t>()[1] - starts.data_ptr<int64_t>()[0] == 1 &&
                  starts.data_ptr<int64_t>()[1] <= 1 && seq_len >= 1 && slots_tab.dim() == 2 &&
                  slots_tab.size(0) >= 1 && seq_len <= slots_tab.size(1),
              "decode step: bad q_start_loc, seq_lens or slot_table");

  // attention work as paged_attention cuts it: one item per KV head, split-K by the same rule
  const int64_t threads = at::get_num_threads();
  const int64_t splits = attention_splits(KV, 1, seq_len, threads);
  std::vector<int64_t> items;
  for (int64_t h = 0; h < KV; ++h) items.insert(items.end(), {0, h, 0, 1});

  // the kernels, resolved once (ANYCORE_PICK may throw; nothing inside the team may)
  RmsNormFn rms_norm = ANYCORE_PICK(rms_norm, op_impls[kOpRmsNorm], 1);
  AddRmsNormFn add_rms_norm = ANYCORE_PICK(add_rms_norm, op_impls[kOpAddRmsNorm], 1);
  RotaryFn rotary = ANYCORE_PICK(apply_rotary, op_impls[kOpRotary], 1);
  GatedActFn silu_mul = ANYCORE_PICK(silu_and_mul, op_impls[kOpSiluMul], 1);
  AttnUnitsFn attn_units = ANYCORE_PICK(attention_units, op_impls[kOpAttention], 1);
  AttnMergeFn attn_merge = ANYCORE_PICK(attention_merge, op_impls[kOpAttention], 1);

  // shared activations; every thread also keeps its own norm output and residual (see top)
  auto bf = hidden.options();
  at::Tensor qkv = at::empty({q_size + 2 * kv_size}, bf), q_rot = at::empty({q_size}, bf);
  at::Tensor attn = at::empty({q_size}, bf), o_out = at::empty({hid}, bf), act = at::empty({inter}, bf);
  at::Tensor h_out = at::empty({1, hid}, bf), res_out = at::empty({1, hid}, bf);
  at::Tensor partial;
  if (splits > 1) partial = at::empty({KV * splits * group * (D + 2)}, bf.dtype(at::kFloat));

  const float eps = static_cast<float>(eps_d);
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  const int64_t es = 2, k_layer = k_pool.stride(0), v_layer = v_pool.stride(0);
  bf16* kc0 = reinterpret_cast<bf16*>(k_pool.data_ptr()) + slot * k_pool.stride(1);
  bf16* vc0 = reinterpret_cast<bf16*>(v_pool.data_ptr()) + slot * v_pool.stride(1);
  bf16* qkv_p = reinterpret_cast<bf16*>(qkv.data_ptr());
  bf16* q_p = reinterpret_cast<bf16*>(q_rot.data_ptr());
  bf16* attn_p = reinterpret_cast<bf16*>(attn.data_ptr());
  bf16* o_p = reinterpret_cast<bf16*>(o_out.data_ptr());
  bf16* act_p = reinterpret_cast<bf16*>(act.data_ptr());
  bf16* h_p = reinterpret_cast<bf16*>(h_out.data_ptr());  // each layer's down output; the last one is returned
  const bf16* x0 = bf16_ptr(hidden);

  AttnArgs a0{};
  a0.out = attn_p, a0.q = q_p;
  a0.q_st = q_size, a0.q_sh = D;
  a0.k_ss = k_pool.stride(1), a0.k_sh = D, a0.v_ss = v_pool.stride(1), a0.v_sh = D;
  a0.q_start = starts.data_ptr<int64_t>(), a0.seq_lens = lens.data_ptr<int64_t>();
  a0.slots = slots_tab.data_ptr<int64_t>(), a0.slots_stride = slots_tab.size(1);
  a0.items = items.data(), a0.num_items = KV;
  a0.num_heads = H, a0.num_kv_heads = KV, a0.head_dim = D;
  a0.scale = static_cast<float>(scale);
  a0.num_splits = splits, a0.rows_per_item = group;
  a0.partial = splits > 1 ? partial.data_ptr<float>() : nullptr;

  const int64_t team = std::max<int64_t>(1, threads);
  const LayerPtrs& l0 = lp[0];
  const Chunks qkv_chunks(l0.qkv.n, team, l0.qkv.unit()), o_chunks(hid, team, l0.o.unit()),
      inter_chunks(inter, team, l0.gate_up.unit()), down_chunks(hid, team, l0.down.unit());
  std::vector<Ticket> tickets(layers * kNumLinears);
  // W8A8 activation workspaces, one per thread (64-byte aligned like at::empty's)
  int64_t ws_bytes = 64;
  for (const Proj* g : {&l0.qkv, &l0.o, &l0.gate_up, &l0.down})
    if (g->i8) ws_bytes = std::max(ws_bytes, (g->i8->workspace_bytes(1, g->k) + 63) / 64 * 64);
    else if (g->gg) ws_bytes = std::max(ws_bytes, (gguf_workspace_bytes(1, g->k) + 63) / 64 * 64);
  at::Tensor workspaces = at::empty({team * ws_bytes}, bf.dtype(at::kByte));
  at::Tensor gate_up = at::empty({2 * inter}, bf);  // W8A8 gate|up outputs (a packed panel spans 16 of them)
  bf16* gu_p = reinterpret_cast<bf16*>(gate_up.data_ptr());
#pragma omp parallel num_threads(static_cast<int>(team))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    // private: norm output, residual (ping-pong: add_rms_norm reads one, writes the other),
    // the gate|up rows of this thread's slice, attention scratch
    std::vector<bf16> normed(hid), res_a(hid), res_b(hid), gu(2 * inter_chunks.bounds[1]);
    void* ws = static_cast<char*>(workspaces.data_ptr()) + t * ws_bytes;
    std::vector<float> scratch(attn_scratch_floats(D));
    std::vector<bf16> qn(lp[0].q_norm ? q_size : 0), kn(lp[0].q_norm ? kv_size : 0);
    const Slice mine_kv = share(KV, 1, t, nt);
    const Slice mine_units = share(KV * splits, 1, t, nt);
    const bf16* res = x0;
    bf16* res_next = res_a.data();
    for (int64_t l = 0; l < layers; ++l) {
      const LayerPtrs& p = lp[l];
      // 1. input norm (layer 0: of the embedding, which is the residual), QKV rows
      if (l == 0) {
        rms_norm(normed.data(), x0, hid, p.input_norm, 1, hid, eps);
      } else {
        add_rms_norm(normed.data(), res_next, h_p, hid, res, hid, p.input_norm, 1, hid, eps);
        res = res_next;
        res_next = res_next == res_a.data() ? res_b.data() : res_a.data();
      }
      Ticket* tk = &tickets[l * kNumLinears];
      p.qkv.prepare(normed.data(), ws);
      take_chunks(tk[kLinQkv], qkv_chunks, [&](Slice r) { p.qkv.run(normed.data(), qkv_p, ws, r); });
      #pragma omp barrier
      // 2. this thread's KV heads: (q/k norm), RoPE, K and V into the pool, attention
      bf16* kc = kc0 + l * k_layer;
      bf16* vc = vc0 + l * v_layer;
      if (mine_kv.size() > 0) {
        const int64_t h0 = mine_kv.begin * group, nh = mine_kv.size() * group;
        const bf16* q_src = qkv_p;
        const bf16* k_src = qkv_p + q_size;
        if (p.q_norm) {  // per-head RMSNorm (Qwen3) into this thread's buffers, then RoPE from there
          rms_norm(qn.data() + h0 * D, qkv_p + h0 * D, D, p.q_norm, nh, D, eps);
          rms_norm(kn.data() + mine_kv.begin * D, k_src + mine_kv.begin * D, D, p.k_norm, mine_kv.size(), D, eps);
          q_src = qn.data(), k_src = kn.data();
        }
        rotary(q_p + h0 * D, q_src + h0 * D, q_size, cs, sn, D, 1, nh, D);
        rotary(kc + mine_kv.begin * D, k_src + mine_kv.begin * D, kv_size, cs, sn, D, 1, mine_kv.size(), D);
        std::memcpy(vc + mine_kv.begin * D, qkv_p + q_size + kv_size + mine_kv.begin * D, mine_kv.size() * D * es);
      }
      AttnArgs a = a0;
      a.k = kc - slot * k_pool.stride(1);
      a.v = vc - slot * v_pool.stride(1);
      if (splits == 1) {
        attn_units(a, mine_kv.begin, mine_kv.end, scratch.data());
      } else {  // other threads read this thread's new K/V row
#pragma omp barrier
        attn_units(a, mine_units.begin, mine_units.end, scratch.data());
#pragma omp barrier
        attn_merge(a, mine_kv.begin, mine_kv.end);
      }
#pragma omp barrier
      // 3. O rows
      p.o.prepare(attn_p, ws);
      take_chunks(tk[kLinO], o_chunks, [&](Slice r) { p.o.run(attn_p, o_p, ws, r); });
#pragma omp barrier
      // 4. residual add + post norm, gate and up rows of this slice, SiLU-and-mul of the slice
      add_rms_norm(normed.data(), res_next, o_p, hid, res, hid, p.post_norm, 1, hid, eps);
      res = res_next;
      res_next = res_next == res_a.data() ? res_b.data() : res_a.data();
      p.gate_up.prepare(normed.data(), ws);
      take_chunks(tk[kLinGateUp], inter_chunks, [&](Slice r) {
        // gate rows r and up rows inter + r, side by side in gu, then SiLU(gate) * up of r
        const int64_t len = r.size();
        const Slice up{inter + r.begin, inter + r.end};
        if (p.gate_up.at_own_index()) {  // panels/rows write at their own columns: through the shared gate|up row
          p.gate_up.run(normed.data(), gu_p, ws, r);
          p.gate_up.run(normed.data(), gu_p, ws, up);
          std::memcpy(gu.data(), gu_p + r.begin, len * es);
          std::memcpy(gu.data() + len, gu_p + up.begin, len * es);
        } else {  // straight into gu
          p.gate_up.run_dense(normed.data(), gu.data(), r);
          p.gate_up.run_dense(normed.data(), gu.data() + len, up);
        }
        silu_mul(act_p + r.begin, gu.data(), 2 * len, 1, len);
      });
#pragma omp barrier
      // 5. down rows
      p.down.prepare(act_p, ws);
      take_chunks(tk[kLinDown], down_chunks, [&](Slice r) { p.down.run(act_p, h_p, ws, r); });
#pragma omp barrier
    }
    if (t == 0) std::memcpy(res_out.data_ptr(), res, hid * es);
  }
  g_team_steps.fetch_add(1, std::memory_order_relaxed);
  return std::make_tuple(h_out, res_out);
}

}  // namespace anycore::ops
