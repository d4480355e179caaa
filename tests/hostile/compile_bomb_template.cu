//@embed _base.cu
// Compile-time "specialisation tree": each level instantiates two force-inlined children, so
// 26 template instances inline into 2^25 copies of the leaf.
template <int D>
struct Tree {
    __device__ __forceinline__ static float eval(float x, const evo_half* p) {
        return Tree<D - 1>::eval(x * 1.0001f, p + 1) + Tree<D - 1>::eval(x - 0.5f, p + 2);
    }
};
template <>
struct Tree<0> {
    __device__ __forceinline__ static float eval(float x, const evo_half* p) { return x * evo_h2f(*p); }
};

extern "C" __global__ void __launch_bounds__(256) hgemm_tree(const evo_half* A, const evo_half* B, evo_half* C,
                                                            int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    if (M < 0) acc[0][0] += Tree<25>::eval(acc[0][1], A);
    evo_store(C, M, N, acc);
}
