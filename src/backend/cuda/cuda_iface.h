/* cuda_iface: the CUDA backend's engine table (backend/backend.h); public:
 * the one CUDA header a front end (apps/cli/cli_backend.c) includes. */
#ifndef STRATA_CUDA_IFACE_H
#define STRATA_CUDA_IFACE_H

struct backend_iface;
const struct backend_iface *cuda_backend_iface(void);

#endif
