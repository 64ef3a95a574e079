// Registers the CUDA backend ("cuda") with the backend registry (registry.h). Defined in the octet_cuda
// library, which only a CUDA build has and which defines OCTET_HAVE_CUDA for whatever links it: a program
// that links octet_cuda calls this, under #ifdef OCTET_HAVE_CUDA, before it asks for "cuda". It is a call
// rather than a static initialiser because a linker drops the object files of a static library that nothing
// refers to, initialisers and all. Calling it again does nothing.
#pragma once

namespace octet {

void register_cuda_backend();

}  // namespace octet
