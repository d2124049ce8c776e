"""Global state that several sessions may share, undone exactly whatever order they end in.

Two `watch()` blocks may overlap, end out of order, or run in two threads. Setting an attribute
back to "what it was when I started" would then drop another session's patch or leave ours
behind. So each patched attribute gets one wrapper, installed by the first session that needs
it and removed by the last; sessions add and remove *layers* on it. The dispatch-mode stack is
handled the same way: a session's mode is taken out wherever it sits, not popped from the top
(which may be another session's).
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading
import types
from typing import Any, Callable

_lock = threading.RLock()
_slots: dict[tuple[int, str], Any] = {}

# A layer is called as layer(call_next, *args, **kwargs) and must call call_next to go on.
Layer = Callable[..., Any]


# While `scan --gpu` records (costmodel/own_time.py OwnTime.layered): called as
# own_timer(_layered, layers, call, args, kwargs) to time the layers' own work apart from the
# call they wrap (gpusync's time between the user's ops is not the user's Python); else None.
own_timer: Callable[..., Any] | None = None


def _through(layers: list[Layer], call: Callable[..., Any], *args, **kwargs):
    """call(*args, **kwargs) through `layers`, the first session's outermost."""
    if own_timer is not None:
        return own_timer(_layered, layers, call, args, kwargs)
    return _layered(layers, call, *args, **kwargs)


def _layered(layers: list[Layer], call: Callable[..., Any], *args, **kwargs):
    if len(layers) == 1:  # the usual case, and on hot paths (Tensor.__getitem__, .device)
        return layers[0](call, *args, **kwargs)
    for layer in reversed(layers):
        call = functools.partial(layer, call)
    return call(*args, **kwargs)


def _calling(layers: list[Layer], original: Any) -> Callable[..., Any]:
    """The function a wrapper runs: `original` through `layers`."""
    @functools.wraps(original)  # its name and doc, as a bound method shows them
    def call(*args, **kwargs):
        if len(layers) == 1 and own_timer is None:  # the usual case, and on hot paths
            return layers[0](original, *args, **kwargs)
        return _through(layers, original, *args, **kwargs)

    call.__module__ = getattr(original, "__module__", None)  # type: ignore[assignment]
    return call


class _Builtin:
    """Stands in for a C function (torch.zeros, F.one_hot): called like it, and seen like it by
    the code that inspects it. A Python function in its place would bind as a method when
    stored on a class, gain a source file, pickle by a name that leads elsewhere, and be unknown
    to TorchScript. `__class__` answers the original's type (isinstance, inspect.isbuiltin);
    attributes not copied here are the original's (__self__, __text_signature__)."""

    def __init__(self, original: Any, layers: list[Layer]):
        self._call, self.__wrapped__ = _calling(layers, original), original
        self._home: tuple[Any, str] = (None, "")  # (owner, name) it is installed as
        for name in ("__name__", "__qualname__", "__doc__"):
            setattr(self, name, getattr(original, name, None))

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    @property  # type: ignore[misc]
    def __class__(self):
        return type(self.__wrapped__)

    def __getattr__(self, name: str):
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)

    def __reduce__(self):  # pickled as the original is: by where it lives
        return self.__wrapped__.__reduce__()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class _BuiltinFunction(_Builtin):
    def __init__(self, original: Any, layers: list[Layer]):
        super().__init__(original, layers)
        self.__module__ = original.__module__

    def __reduce__(self):
        """By name where that name leads to this object (torch.zeros), as pickle does for a
        C function; otherwise as the original reduces."""
        module = sys.modules.get(self.__module__ or "")
        if getattr(module, self.__name__ or "", None) is self:
            return self.__name__
        return super().__reduce__()


# Named as the types they stand for: `type(f).__name__`, and messages that print it
# (inspect.getfile's TypeError), read the same.
_BuiltinFunction.__name__ = _BuiltinFunction.__qualname__ = "builtin_function_or_method"


class _MethodDescriptor(_Builtin):
    """A C method of a class (Tensor.to, Tensor.__getitem__): binds to its instance, has no
    __module__, as the original."""

    def __get__(self, obj, cls=None):
        return self if obj is None else types.MethodType(self._call, obj)

    @property
    def __module__(self):  # type: ignore[override]
        raise AttributeError("__module__")

    def __reduce__(self):  # by the class it is installed on: unpickles to this object
        return getattr, self._home


class _Function(_Builtin):
    """A Python function (torch.cuda.is_available, Tensor.__repr__): binds as one, and its
    __code__, __globals__, source file are the original's (inspect, TorchScript)."""

    def __init__(self, original: Any, layers: list[Layer]):
        super().__init__(original, layers)
        self.__module__ = original.__module__

    def __get__(self, obj, cls=None):
        return self if obj is None else types.MethodType(self._call, obj)

    def __reduce__(self):
        """By its qualified name, as pickle saves a function, where that leads to this object;
        otherwise by the attribute it is installed as."""
        found: Any = sys.modules.get(self.__module__ or "")
        for part in (self.__qualname__ or "").split("."):
            found = getattr(found, part, None)
        if found is self:
            return self.__qualname__
        owner, name = self._home
        return name if isinstance(owner, types.ModuleType) else (getattr, self._home)


_Function.__name__ = _Function.__qualname__ = "function"


@functools.cache
def _descriptor_class(kind: type) -> type:
    """_MethodDescriptor named as `kind` (method_descriptor, wrapper_descriptor)."""
    return type(kind.__name__, (_MethodDescriptor,),
                {"__slots__": (), "__module__": vars(_MethodDescriptor)["__module__"]})


def _builtin_table() -> dict[int, str]:
    """TorchScript's table of the Python callables it compiles as aten ops, keyed by id(); built
    before any of ours is installed, so that it holds torch's own functions."""
    from torch.jit import _builtins

    return _builtins._get_builtin_table()


_AS_SEQUENCE = 13  # PyTypeObject.tp_as_sequence, in pointers from the start (3.8 to 3.13)
_HEAP_TYPE_SIZE: int = vars(type)["__basicsize__"].__get__(type)  # sizeof(PyHeapTypeObject)
_SEQUENCE_SLOTS = {"__getitem__": 3, "__setitem__": 5}  # sq_item, sq_ass_item


def _sequence_slot(owner: Any, name: str) -> ctypes.c_void_p | None:
    """The sq_item / sq_ass_item slot that setting `name` on a heap type (Tensor) fills in
    besides the mapping slot, where torch's C type has only the mapping one: a 0-d tensor
    would then pass PySequence_Check, and torch.tensor([t0, t1]) ask its len(). Restoring the
    attribute does not empty it (CPython cannot tell which of the two slots was the type's)."""
    index = _SEQUENCE_SLOTS.get(name)
    if index is None or not isinstance(owner, type) or not owner.__flags__ & (1 << 9):
        return None
    pointer = ctypes.c_void_p.from_address(id(owner) + _AS_SEQUENCE * ctypes.sizeof(
        ctypes.c_void_p)).value
    if pointer is None or not id(owner) < pointer < id(owner) + _HEAP_TYPE_SIZE:
        return None  # not this interpreter's layout (a heap type holds its own methods)
    return ctypes.c_void_p.from_address(pointer + index * ctypes.sizeof(ctypes.c_void_p))


def _set_keeping_sequence(owner: Any, name: str, value: Any = None, delete: bool = False):
    slot = _sequence_slot(owner, name)
    saved = slot.value if slot is not None else None
    if delete:
        delattr(owner, name)
    else:
        setattr(owner, name, value)
    if slot is not None:
        slot.value = saved


class _Slot:
    def __init__(self, owner: Any, name: str):
        self.owner, self.name = owner, name
        self.own = name in vars(owner)
        self.original = vars(owner)[name] if self.own else getattr(owner, name)
        self.layers: list[Layer] = []
        self.scripted = False
        layers, original = self.layers, self.original
        wrapper: Any
        if isinstance(original, types.FunctionType):
            wrapper = _Function(original, layers)
        elif isinstance(original, types.BuiltinFunctionType):
            wrapper = _BuiltinFunction(original, layers)
        elif isinstance(original, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            wrapper = _descriptor_class(type(original))(original, layers)  # type: ignore[arg-type]
        else:
            @functools.wraps(original)
            def wrapper(*args, **kwargs):
                return _through(layers, original, *args, **kwargs)
        table = _builtin_table()
        op = table.get(id(original))
        if op is not None:  # a scripted function calling torch.zeros compiles to aten::zeros
            table[id(wrapper)] = op
            self.scripted = True
        if isinstance(wrapper, _Builtin):
            wrapper._home = (owner, name)
        self.wrapper = wrapper
        _set_keeping_sequence(owner, name, wrapper)

    def restore(self) -> None:
        if self.scripted:
            _builtin_table().pop(id(self.wrapper), None)
        if self.own:
            _set_keeping_sequence(self.owner, self.name, self.original)
        else:  # it was inherited: remove ours, leave no copy behind
            _set_keeping_sequence(self.owner, self.name, delete=True)


class _GetSet(property):
    """A property (its getter runs in C, as a getset's does) that is seen as the getset it
    replaces: its type, name and class."""

    @property  # type: ignore[misc]
    def __class__(self):
        return type(self.__wrapped__)

    def __getattr__(self, name: str):
        return getattr(self.__wrapped__, name)


_GetSet.__name__ = _GetSet.__qualname__ = "getset_descriptor"


class _PropertySlot:
    """A data descriptor (a C getset such as Tensor.data) replaced by a property whose getter
    and setter run their own layers: layer(call, obj) and layer(call, obj, value)."""

    def __init__(self, owner: Any, name: str):
        self.owner, self.name = owner, name
        self.own = name in vars(owner)
        self.original = vars(owner)[name] if self.own else getattr(owner, name)
        self.get_layers: list[Layer] = []
        self.set_layers: list[Layer] = []
        get, set_ = self.original.__get__, self.original.__set__
        getters, setters = self.get_layers, self.set_layers
        setattr(owner, name, _GetSet(lambda obj: _through(getters, get, obj),
                                     lambda obj, value: _through(setters, set_, obj, value),
                                     doc=getattr(self.original, "__doc__", None)))
        vars(owner)[name].__wrapped__ = self.original

    def empty(self) -> bool:
        return not self.get_layers and not self.set_layers

    scripted = False
    restore = _Slot.restore


class _AliasSlot:
    """owner.name made the very object source.name is now (F.one_hot is torch._C._nn.one_hot:
    so both stay one object, which pickle checks); `layers` holds its users."""

    scripted = False

    def __init__(self, owner: Any, name: str, source: Any, source_name: str):
        self.owner, self.name = owner, name
        self.own = name in vars(owner)
        self.original = vars(owner)[name] if self.own else getattr(owner, name)
        self.layers: list[Any] = []
        setattr(owner, name, getattr(source, source_name))

    restore = _Slot.restore


class Handle:
    """Removes one layer; safe to call twice."""

    def __init__(self, key: tuple[int, str], layer: Any):
        self._key, self._layer = key, layer

    def remove(self) -> None:
        with _lock:
            slot = _slots.get(self._key)
            if slot is None:
                return
            if isinstance(slot, _PropertySlot):
                lists = (slot.get_layers, slot.set_layers)
                found = next((ls for ls in lists if any(x is self._layer for x in ls)), None)
                if found is None:
                    return
                found.remove(self._layer)
                gone = slot.empty()
            else:
                if self._layer not in slot.layers:
                    return
                slot.layers.remove(self._layer)
                gone = not slot.layers
            if gone:
                del _slots[self._key]
                slot.restore()


def add_layer(owner: Any, name: str, layer: Layer) -> Handle:
    """Wrap owner.name with `layer` until the handle is removed."""
    key = (id(owner), name)
    with _lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _slots[key] = _Slot(owner, name)
        slot.layers.append(layer)
    return Handle(key, layer)


def add_alias(owner: Any, name: str, source: Any, source_name: str) -> Handle:
    """owner.name is source.name (already wrapped by add_layer) until the handle is removed."""
    key, token = (id(owner), name), object()
    with _lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _slots[key] = _AliasSlot(owner, name, source, source_name)
        slot.layers.append(token)
    return Handle(key, token)


def add_property_layer(owner: Any, name: str, get: Layer | None = None,
                       set: Layer | None = None) -> list[Handle]:
    """Wrap the getter and/or setter of the data descriptor owner.name until the handles are
    removed; the getter of a property whose only layer is a setter stays the original's."""
    key = (id(owner), name)
    handles = []
    with _lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _slots[key] = _PropertySlot(owner, name)
        if not isinstance(slot, _PropertySlot):
            raise TypeError(f"{name} is patched as a function already")
        for layer, layers in ((get, slot.get_layers), (set, slot.set_layers)):
            if layer is not None:
                layers.append(layer)
                handles.append(Handle(key, layer))
    return handles



class Swap:
    """Set owner.name to a value outright (a class stays a class for isinstance checks); the
    original is put back, or the attribute removed, by remove(). For values no layer can
    stand in front of: classes, constants."""

    def __init__(self, owner: Any, name: str, value: Any):
        self.owner, self.name = owner, name
        self.own = name in vars(owner)
        self.original = vars(owner).get(name)
        setattr(owner, name, value)

    def remove(self) -> None:
        if self.own:
            setattr(self.owner, self.name, self.original)
        else:
            delattr(self.owner, self.name)


class Shared:
    """A global setting several sessions need at once (e.g. the CUDA sync-debug mode): `enter`
    runs for the first user and returns what `leave` gets back when the last one goes."""

    def __init__(self, enter: Callable[[], Any], leave: Callable[[Any], None]):
        self._enter, self._leave = enter, leave
        self._users = 0
        self._saved: Any = None

    def acquire(self) -> None:
        with _lock:
            if self._users == 0:
                self._saved = self._enter()
            self._users += 1

    def release(self) -> None:
        with _lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0:
                self._leave(self._saved)
                self._saved = None


_FLAG_DEQUES = ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
                "old_without_ignore_compile_internals_dispatch_mode_flags")


def exit_dispatch_mode(mode) -> None:
    """Take `mode` out of this thread's torch-dispatch mode stack, wherever it sits.

    On top, it exits as usual. Below another mode, it is unlinked: the global "in a dispatch
    mode" flags it saved on entry are handed to the mode just above it, which will restore
    them when it exits, so no flag stays set once every mode is gone."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode

    stack = _get_current_dispatch_mode_stack()
    if not any(m is mode for m in stack):
        return
    if stack[-1] is mode:
        mode.__exit__(None, None, None)
        return
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    successor = above[-1]  # the mode that was pushed right after ours
    depth = sum(m is successor for m in above)  # its entries newer than that push
    for name in _FLAG_DEQUES:
        ours, theirs = getattr(mode, name, None), getattr(successor, name, None)
        if ours and theirs and len(theirs) >= depth:
            theirs[-depth] = ours.pop()
        elif ours:
            ours.pop()
    for m in reversed(above):
        _push_mode(m)
