//@embed _good.cu
#define EVO_T(x) x x x x
#if 0
__device__ void evo_unused() { EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(EVO_T(y)))))))))))))))))))))))); }
#endif
