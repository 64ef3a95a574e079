// Where each parameter of octet's decoder lies in a Hugging Face checkpoint of its class. GPT-2 and Llama
// checkpoints hold every parameter as one tensor under the decoder's own Hugging Face name and layout
// (Model::hf_name and hf_shape, which octet's checkpoints use too). A Mixtral checkpoint names the
// mixture-of-experts block otherwise (C channels, F each expert's SwiGLU width, E experts, N a layer), in
// one of two layouts:
//
//   classic, which every transformers version loads and transformers 5's save_pretrained writes (it
//   reverts its in-memory fusion on save unless save_original_format=False):
//     model.layers.N.block_sparse_moe.gate.weight          [E, C]  the router
//     model.layers.N.block_sparse_moe.experts.E.w1.weight  [F, C]  expert E's gate projection
//     model.layers.N.block_sparse_moe.experts.E.w3.weight  [F, C]  its up projection
//     model.layers.N.block_sparse_moe.experts.E.w2.weight  [C, F]  its down projection
//
//   fused, transformers 5's modules as they hold the weights in memory (what save_pretrained writes with
//   save_original_format=False):
//     model.layers.N.mlp.gate.weight                       [E, C]      the router
//     model.layers.N.mlp.experts.gate_up_proj              [E, 2F, C]  expert e's gate rows [e, 0:F), then
//                                                                      its up rows [e, F:2F)
//     model.layers.N.mlp.experts.down_proj                 [E, C, F]   expert e's down projection [e]
//
// Every parameter is a contiguous run of elements in either layout, so a place is a tensor and a range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "octet/huggingface/hf_config.h"
#include "octet/model/model.h"

namespace octet::hf {

// `count` elements of the tensor `tensor` (of shape `shape`, row-major) from element `offset` on, in the
// layout of Model::hf_shape.
struct TensorPlace {
  std::string tensor;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t count = 0;
};

// The places a checkpoint of `architecture` may hold parameter `p` of `model` in, the classic one (the one
// the export writes) first; a parameter outside Mixtral's experts block has one place. `config` is the
// model's configuration. A shared expert's parameter has no Mixtral place: an internal error.
std::vector<TensorPlace> tensor_places(const Model& model, const ParameterInfo& p, const ModelConfig& config,
                                       HfArchitecture architecture);

}  // namespace octet::hf
