//@embed _good.cu
