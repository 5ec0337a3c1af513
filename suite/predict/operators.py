"""The classes of aten operators that the trace records and the timing prices: matrix
multiplies and attention (whose shapes the trace keeps), views (which move no data), and the
metadata queries the trace leaves out. Names as the trace records them ("aten.mm")."""

MATMULS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")
ATTENTION_PREFIX = ("aten._scaled_dot_product", "aten._flash_attention", "aten._efficient_attention")
# Operators that move no data (views, metadata): they cost dispatch time only.
VIEWS = {
    "aten.view",
    "aten._unsafe_view",
    "aten.t",
    "aten.transpose",
    "aten.permute",
    "aten.expand",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.slice",
    "aten.select",
    "aten.split",
    "aten.split_with_sizes",
    "aten.unbind",
    "aten.as_strided",
    "aten.detach",
    "aten.alias",
    "aten.lift_fresh",
    "aten.unflatten",
    "aten.chunk",
    "aten.narrow",
    "aten.diagonal",
}
METADATA = {"prim.device", "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.is_contiguous", "aten.dim"}
"""Queries of a tensor's metadata: no operator of the step, not recorded."""
