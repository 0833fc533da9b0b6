"""Minimal numpy layers with hand-written backward passes, for the digits example.

Activations are NCHW and convolution weights OIHW, exactly as ONNX lays them out, so the
trained arrays export without any transposition. A convolution is lowered to a matmul with
im2col: y[n, o, l] = sum_k W[o, k] * cols[n, k, l], where k runs over (c, kh, kw) and l over
the output pixels; its input gradient scatters W^T dy back with col2im.

Every loop runs in a fixed order and nothing is random after initialisation, so training is
bit-for-bit reproducible for a given seed and BLAS thread count.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "Array",
    "Layer",
    "Conv2d",
    "BatchNorm2d",
    "Relu",
    "Flatten",
    "Dense",
    "Adam",
    "softmax_cross_entropy",
]

Array = npt.NDArray[np.float64]


def _windows(size: int, k: int, stride: int, pad: int) -> int:
    """Number of output positions along one spatial axis."""
    return (size + 2 * pad - k) // stride + 1


def im2col(x: Array, k: int, stride: int, pad: int) -> Array:
    """Unfold NCHW ``x`` into columns of shape [N, C*k*k, OH*OW]."""
    n, c, h, w = x.shape
    oh, ow = _windows(h, k, stride, pad), _windows(w, k, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.empty((n, c, k, k, oh, ow), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
    return cols.reshape(n, c * k * k, oh * ow)


def col2im(cols: Array, shape: tuple[int, ...], k: int, stride: int, pad: int) -> Array:
    """Adjoint of :func:`im2col`: sum columns back into an NCHW array of ``shape``."""
    n, c, h, w = shape
    oh, ow = _windows(h, k, stride, pad), _windows(w, k, stride, pad)
    cols6 = cols.reshape(n, c, k, k, oh, ow)
    xp = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    for i in range(k):
        for j in range(k):
            xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride] += cols6[:, :, i, j]
    return xp[:, :, pad : pad + h, pad : pad + w]


class Layer:
    """A differentiable step: ``forward`` caches what ``backward`` needs."""

    def __init__(self) -> None:
        self.params: dict[str, Array] = {}
        self.grads: dict[str, Array] = {}

    def forward(self, x: Array, train: bool) -> Array:
        """Compute the output; ``train`` selects batch statistics where it matters."""
        raise NotImplementedError

    def backward(self, dy: Array) -> Array:
        """Given dL/dy, fill ``self.grads`` and return dL/dx."""
        raise NotImplementedError


class Conv2d(Layer):
    """Square-kernel convolution without bias (a following BatchNorm supplies the shift)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, pad: int, rng: np.random.Generator) -> None:
        super().__init__()
        self.k, self.stride, self.pad = k, stride, pad
        fan_in = cin * k * k
        self.params["weight"] = rng.normal(0.0, np.sqrt(2.0 / fan_in), (cout, cin, k, k))
        self._cols: Array = np.empty(0)
        self._shape: tuple[int, ...] = ()

    def forward(self, x: Array, train: bool) -> Array:
        """y = W (*) x, computed as W2 @ im2col(x)."""
        n, _, h, _ = x.shape
        self._shape, self._cols = x.shape, im2col(x, self.k, self.stride, self.pad)
        weight = self.params["weight"]
        y: Array = np.matmul(weight.reshape(weight.shape[0], -1), self._cols)
        return y.reshape(n, weight.shape[0], _windows(h, self.k, self.stride, self.pad), -1)

    def backward(self, dy: Array) -> Array:
        """dW = sum_n dy_n cols_n^T; dx = col2im(W2^T dy)."""
        weight = self.params["weight"]
        dy3 = dy.reshape(dy.shape[0], dy.shape[1], -1)
        self.grads["weight"] = np.tensordot(dy3, self._cols, axes=([0, 2], [0, 2])).reshape(weight.shape)
        dcols = np.matmul(weight.reshape(weight.shape[0], -1).T, dy3)
        return col2im(dcols, self._shape, self.k, self.stride, self.pad)


class BatchNorm2d(Layer):
    """Per-channel batch normalisation with ONNX-style running statistics.

    Training uses batch statistics and updates running = momentum * running + (1 - momentum) * batch;
    inference uses y = gamma * (x - mean) / sqrt(var + eps) + beta with the running values.
    """

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.9) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.params["scale"] = np.ones(channels)
        self.params["bias"] = np.zeros(channels)
        self.running_mean = np.zeros(channels)
        self.running_var = np.ones(channels)
        self._xhat: Array = np.empty(0)
        self._inv_std: Array = np.empty(0)

    def forward(self, x: Array, train: bool) -> Array:
        """Normalise over (N, H, W) for each channel."""
        if train:
            mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
            self.running_mean = self.momentum * self.running_mean + (1 - self.momentum) * mean
            self.running_var = self.momentum * self.running_var + (1 - self.momentum) * var
        else:
            mean, var = self.running_mean, self.running_var
        self._inv_std = 1.0 / np.sqrt(var + self.eps)
        self._xhat = (x - mean[None, :, None, None]) * self._inv_std[None, :, None, None]
        scale, bias = self.params["scale"][None, :, None, None], self.params["bias"][None, :, None, None]
        return scale * self._xhat + bias

    def backward(self, dy: Array) -> Array:
        """The standard batch-statistics gradient (training mode only)."""
        axes = (0, 2, 3)
        m = dy.shape[0] * dy.shape[2] * dy.shape[3]
        self.grads["scale"] = np.sum(dy * self._xhat, axis=axes)
        self.grads["bias"] = np.sum(dy, axis=axes)
        dxhat = dy * self.params["scale"][None, :, None, None]
        total = np.sum(dxhat, axis=axes)[None, :, None, None]
        proj = np.sum(dxhat * self._xhat, axis=axes)[None, :, None, None]
        dx: Array = (self._inv_std[None, :, None, None] / m) * (m * dxhat - total - self._xhat * proj)
        return dx


class Relu(Layer):
    """max(x, 0)."""

    def __init__(self) -> None:
        super().__init__()
        self._mask: npt.NDArray[np.bool_] = np.empty(0, dtype=bool)

    def forward(self, x: Array, train: bool) -> Array:
        """Zero the negatives."""
        self._mask = x > 0
        return np.where(self._mask, x, 0.0)

    def backward(self, dy: Array) -> Array:
        """Pass the gradient where the input was positive."""
        return np.where(self._mask, dy, 0.0)


class Flatten(Layer):
    """[N, ...] -> [N, prod(...)], as ONNX Flatten(axis=1)."""

    def __init__(self) -> None:
        super().__init__()
        self._shape: tuple[int, ...] = ()

    def forward(self, x: Array, train: bool) -> Array:
        """Collapse all but the batch axis."""
        self._shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy: Array) -> Array:
        """Restore the input shape."""
        return dy.reshape(self._shape)


class Dense(Layer):
    """y = x W^T + b with W of shape [out, in], as ONNX Gemm(transB=1)."""

    def __init__(self, fan_in: int, fan_out: int, rng: np.random.Generator) -> None:
        super().__init__()
        self.params["weight"] = rng.normal(0.0, np.sqrt(1.0 / fan_in), (fan_out, fan_in))
        self.params["bias"] = np.zeros(fan_out)
        self._x: Array = np.empty(0)

    def forward(self, x: Array, train: bool) -> Array:
        """Affine map."""
        self._x = x
        return x @ self.params["weight"].T + self.params["bias"]

    def backward(self, dy: Array) -> Array:
        """dW = dy^T x, db = sum dy, dx = dy W."""
        self.grads["weight"] = dy.T @ self._x
        self.grads["bias"] = dy.sum(axis=0)
        return dy @ self.params["weight"]


def softmax_cross_entropy(logits: Array, labels: npt.NDArray[np.int64]) -> tuple[float, Array]:
    """Mean cross-entropy of integer ``labels`` and its gradient with respect to ``logits``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(labels.shape[0])
    loss = float(-log_probs[rows, labels].mean())
    grad = np.exp(log_probs)
    grad[rows, labels] -= 1.0
    return loss, grad / labels.shape[0]


class Adam:
    """Adam with decoupled weight decay on rank >= 2 tensors (AdamW)."""

    def __init__(self, layers: list[Layer], lr: float, weight_decay: float = 0.0) -> None:
        self.layers, self.lr, self.weight_decay = layers, lr, weight_decay
        self.beta1, self.beta2, self.eps, self.t = 0.9, 0.999, 1e-8, 0
        self._m = [{k: np.zeros_like(v) for k, v in layer.params.items()} for layer in layers]
        self._v = [{k: np.zeros_like(v) for k, v in layer.params.items()} for layer in layers]

    def step(self) -> None:
        """Apply one update from the gradients the last backward pass left in each layer."""
        self.t += 1
        c1, c2 = 1 - self.beta1**self.t, 1 - self.beta2**self.t
        for layer, m, v in zip(self.layers, self._m, self._v, strict=True):
            for name, p in layer.params.items():
                g = layer.grads[name]
                m[name] = self.beta1 * m[name] + (1 - self.beta1) * g
                v[name] = self.beta2 * v[name] + (1 - self.beta2) * g * g
                if p.ndim >= 2:
                    p *= 1 - self.lr * self.weight_decay
                p -= self.lr * (m[name] / c1) / (np.sqrt(v[name] / c2) + self.eps)
