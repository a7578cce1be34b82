/* cli_backend: which GPU backend this program has. Compiled twice: as is
 * into build/strata (no GPU backend: --gpu is a usage error naming the
 * build that has one), and with -DSTRATA_CUDA into build/cuda/strata, which
 * links libstrata_cuda.a (`make cuda`). */
#include "cli.h"

#ifdef STRATA_CUDA
#include "backend/cuda/cuda_iface.h"
const struct backend_iface *cli_gpu_backend(void) { return cuda_backend_iface(); }
#else
const struct backend_iface *cli_gpu_backend(void) { return NULL; }
#endif
