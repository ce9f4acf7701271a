"""Gradient compression for allreduce: ``hvd.Compression.none`` and ``hvd.Compression.fp16``."""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface: compress a tensor before the collective, decompress the result."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and the context `decompress` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor, back in its original form."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Returns the tensor unchanged."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Returns the tensor unchanged."""
        return tensor


class FP16Compressor(Compressor):
    """Send floating point tensors as float16 (half the bytes); other dtypes unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Downcast a floating point tensor to float16; the context is its original dtype."""
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Upcast back to the original dtype."""
        dtype = ctx
        if dtype is not None and dtype.is_floating_point and tensor.dtype != dtype:
            return tensor.to(dtype)
        return tensor


class Compression:
    """The compression algorithms ``allreduce`` and ``DistributedOptimizer`` accept."""

    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
