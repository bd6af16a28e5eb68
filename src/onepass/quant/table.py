"""The token embedding / output head of a quantized artifact kept as stored (``--compute
stored``), decoded only where it is read.

The table is a fifth of a small model, yet a request reads few of its rows: the embedding
looks up the prompt's tokens, a decision multiplies only its candidates' output rows. So under
``stored`` the table stays in its file codec (bfloat16, or int8 with one scale per row) and
each read decodes just its rows; a generation step's full-vocabulary logits decode it a block
of rows at a time. On tied models (SmolLM2, Gemma) the embedding and the head share one table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from onepass.quant.formats import Tensors, decode_embedding

BLOCK_ROWS = 8192  # rows decoded at once for full-vocabulary logits (bounds the temporary)


class StoredTable(nn.Module):
    """``[rows, dim]`` in a file codec; :meth:`rows` decodes some of it."""

    def __init__(self, codec: str, stored: Tensors, dtype: torch.dtype):
        super().__init__()
        self.codec = codec
        self.dtype = dtype
        self.register_buffer("stored_weight", stored["weight"].contiguous())
        scale = stored.get("scale")
        self.register_buffer("stored_scale", None if scale is None else scale.contiguous())

    @property
    def shape(self) -> torch.Size:
        return self.stored_weight.shape

    def rows(self, index: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        stored = {"weight": self.stored_weight}
        if self.stored_scale is not None:
            stored["scale"] = self.stored_scale
        return decode_embedding(self.codec, stored, dtype or self.dtype, rows=index)


class StoredEmbedding(nn.Module):
    """An embedding lookup that decodes only the looked-up rows (times the model's own
    ``embed_scale``, as Gemma's scaled embedding has)."""

    def __init__(self, table: StoredTable, embed_scale: torch.Tensor | None = None):
        super().__init__()
        self.table = table
        self.embed_scale = embed_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.table.rows(ids.reshape(-1).to(self.table.stored_weight.device))
        out = out.view(*ids.shape, -1)
        return out if self.embed_scale is None else out * self.embed_scale.to(out.dtype)


class StoredHead(nn.Module):
    """The output projection: :meth:`rows` for a decision's candidates, ``forward`` for the
    full vocabulary a block of rows at a time."""

    bias = None

    def __init__(self, table: StoredTable):
        super().__init__()
        self.table = table
        self.out_features, self.in_features = table.shape

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Float32 output rows ``index`` (the decision readout's exact projection)."""
        return self.table.rows(index, torch.float32)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        blocks = [
            F.linear(hidden, self.table.rows(torch.arange(lo, min(lo + BLOCK_ROWS,
                                                                  self.out_features)),
                                             hidden.dtype))
            for lo in range(0, self.out_features, BLOCK_ROWS)
        ]
        return torch.cat(blocks, dim=-1)


def install_stored_tables(model: nn.Module, codec: str, stored: dict[str, Tensors],
                          dtype: torch.dtype) -> None:
    """Put the artifact's tables (state-dict name -> stored tensors) into ``model`` as
    :class:`StoredEmbedding` / :class:`StoredHead`; a tied head reads the embedding's table."""
    names = {module: name for name, module in model.named_modules()}
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    embed_name, head_name = names[embedding], names.get(head)
    tables = {name: StoredTable(codec, tensors, dtype) for name, tensors in stored.items()}
    embed_table = tables[f"{embed_name}.weight"]
    scale = getattr(embedding, "embed_scale", None)
    model.set_input_embeddings(StoredEmbedding(embed_table, scale))
    if head is not None:
        model.set_output_embeddings(StoredHead(tables.get(f"{head_name}.weight", embed_table)))
