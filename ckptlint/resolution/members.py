"""The evaluator's members: what ``value.attribute`` gives, for every kind of value.

A class's member is the first definition along its MRO (an external class on the way may
define it too: ``UNKNOWN``), bound as Python binds it (methods to the instance, classmethods
to the class, staticmethods not at all); an instance's is what its classes' methods store in
``self.<attribute>`` (a constructor's store with the arguments the instance was made with),
else its class's member, also in the subclasses of its module a ``self`` may be; ``super()``
continues along the instance's MRO; a module's is its member (see ``modules``); an external
value's is its qualified name, a torch mapping container's the module under that key.
``member_under`` reads an attribute where flags of the instance are known true.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ckptlint.project.index import Module
from ckptlint.project.scopes import FUNCTIONS, Binding, body_containing, fold, statements_at
from ckptlint.resolution.bodies import first_parameter, line_span, statements_on_line
from ckptlint.resolution.containers import KEY_READS, made_for
from ckptlint.resolution.values import (
    UNKNOWN,
    Argument,
    Arguments,
    CallKeywords,
    ClassValue,
    Constant,
    Context,
    Environment,
    External,
    FunctionValue,
    Instance,
    Mapping,
    Method,
    ModuleValue,
    Parameter,
    Sequence,
    Super,
    Value,
    Values,
    known,
    unique,
)
from ckptlint.torch_catalogue import CONTAINERS, MAPPING_CONTAINERS, canonical

if TYPE_CHECKING:
    from ckptlint.resolution.evaluator import Evaluator

AUTOGRAD_FUNCTIONS = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
_MODULE_ITERATORS = frozenset({"children", "modules", "named_children", "named_modules"})


class Members:
    """The evaluator's part that looks up attributes (see the module docstring)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.classes = evaluator.classes

    def member_of(self, value: Value, attribute: str) -> Values:
        """``value.attribute`` (``Evaluator.member`` asks it of the solver)."""
        evaluator = self.evaluator
        if isinstance(value, External):
            if evaluator.project.layout.is_project_package(value.name):
                return (evaluator.module_value(f"{value.name}.{attribute}"),)
            return (External(canonical(f"{value.name}.{attribute}")),)
        if isinstance(value, ModuleValue):
            return evaluator.modules.module_member(value.module, attribute) or (UNKNOWN,)
        if isinstance(value, Instance):
            return self.instance_member(value, attribute)
        if isinstance(value, ClassValue):
            return self._class_member(value, attribute, None)
        if isinstance(value, Super):
            return self._super_member(value, attribute)
        if isinstance(value, (Mapping, Sequence)):
            return (Method(value, attribute),)
        if isinstance(value, CallKeywords) and attribute in KEY_READS:
            return (Method(value, attribute),)
        if isinstance(value, FunctionValue) and attribute == "__call__":
            return (value,)
        if evaluator.duck_typing and isinstance(value, Parameter) and self._untyped(value):
            return self._duck_typed_member(value.module, attribute)
        return (UNKNOWN,)

    def _untyped(self, parameter: Parameter) -> bool:
        """No annotation, or one naming no project class (``model: nn.Module``)."""
        annotation = parameter.node.annotation
        if annotation is None:
            return True
        evaluator = self.evaluator
        annotated = evaluator.evaluate(annotation, evaluator.module_context(parameter.module))
        return not any(isinstance(value, ClassValue) for value in annotated)

    def _duck_typed_member(self, module: Module, attribute: str) -> Values:
        """``model.transformer`` where nothing says what ``model`` is: the member of each
        class the module defines or imports that has such an attribute (or UNKNOWN)."""
        classes = self.classes
        results: list[Value] = []
        for cls in classes.visible_classes(module):
            if any(classes.instance_assignments(c, attribute) for c in classes.project_mro(cls)):
                results.extend(self._member_in_mro(cls, attribute, Instance(cls, exact=False)))
        return unique(results) or (UNKNOWN,)

    def member_under(self, values: Values, attribute: str, flags: frozenset[str]) -> Values:
        """``x.attribute`` read where ``x.<flag>`` is true for each of ``flags`` (``if
        self.gradient_checkpointing: self._gradient_checkpointing_func(...)``): a value
        stored by a call that, in the same block, sets one of those flags false cannot be
        the one read there, provided every store that may set the flag true also stores
        the attribute (a later call made the flag true, and stored its own value)."""
        evaluator = self.evaluator
        results: list[Value] = []
        for value in values:
            if isinstance(value, Instance):
                key = ("member under", value, attribute, flags)
                results.extend(
                    evaluator.guarded(key, self.instance_member, value, attribute, flags)
                )
            else:
                results.extend(evaluator.member((value,), attribute))
        return unique(results) or (UNKNOWN,)

    def instance_member(
        self, instance: Instance, attribute: str, flags: frozenset[str] = frozenset()
    ) -> Values:
        cls = instance.cls
        if isinstance(cls, External):
            return self._external_instance_member(instance, attribute)
        results: list[Value] = []
        classes = [cls]
        if not instance.exact:
            classes.extend(self.classes.subclasses_overriding(cls, attribute))
        for owner in classes:
            view = instance if owner is cls else Instance(owner, exact=False)
            results.extend(self._member_in_mro(owner, attribute, view, flags))
        if attribute == "__call__" and not known(tuple(results)):
            return (instance,)  # ``module.__call__`` runs the module, as calling it does
        if attribute in _MODULE_ITERATORS and not known(tuple(results)):
            return (Method(instance, attribute),)  # nn.Module's own, not overridden
        return unique(results) or (UNKNOWN,)

    def _member_in_mro(
        self,
        cls: ClassValue,
        attribute: str,
        instance: Instance,
        flags: frozenset[str] = frozenset(),
    ) -> Values:
        order = self.classes.mro(cls)
        for owner in order:
            if isinstance(owner, External):
                break
            assigned = self.classes.instance_assignments(owner, attribute)
            if assigned and flags:
                return unique(
                    v for b in assigned for v in self._stored_under(b, owner, instance, flags)
                )
            if assigned:
                return unique(v for b in assigned for v in self.assigned(b, owner, instance))
        return self._first_member(order, attribute, instance)

    def _stored_under(
        self, binding: Binding, owner: ClassValue, instance: Instance, flags: frozenset[str]
    ) -> Values:
        """``self.<attribute> = value`` as seen where ``flags`` are true (see
        ``member_under``): the values its method's calls store, less those of calls that
        set a flag false beside it; as ``assigned`` when that cannot be told."""
        evaluator = self.evaluator
        method = binding.scope.node
        self_name = binding.scope.self_name
        if not isinstance(method, FUNCTIONS) or binding.value is None or self_name is None:
            return self.assigned(binding, owner, instance)
        beside = _block_of(method, binding.position[0])
        switches = [
            statement.value
            for statement in beside
            if _stores(statement, self_name, flags) and isinstance(statement, ast.Assign)
        ]
        attribute = binding.name
        if not switches or not all(
            self._set_true_only_with(flag, attribute, instance) for flag in flags
        ):
            return self.assigned(binding, owner, instance)
        function = FunctionValue(method, Context(owner.module, binding.scope.parent))  # type: ignore[arg-type]
        callers = evaluator.callers(function)
        if callers is None:
            return self.assigned(binding, owner, instance)
        results: list[Value] = []
        for callee, arguments in callers:
            context = evaluator.bind(FunctionValue(method, callee.context, (instance,)), arguments)
            if any(all(_falsy(v) for v in evaluator.evaluate(w, context)) for w in switches):
                continue  # this call switches the flag off: its value is never read there
            values = evaluator.evaluate(binding.value, context)
            for index in binding.path:
                values = unique(
                    v for value in values for v in evaluator.containers.item(value, index)
                )
            results.extend(values)
        return tuple(results)

    def _set_true_only_with(self, flag: str, attribute: str, instance: Instance) -> bool:
        """Whether every ``self.<flag> = ...`` of the instance's classes that may set it
        true also stores ``self.<attribute>`` in the same block."""
        classes = self.classes
        cls = instance.cls
        if not isinstance(cls, ClassValue):
            return False
        owners = [*classes.project_mro(cls), *classes.subclasses_overriding(cls, flag)]
        for owner in owners:
            for store in classes.instance_assignments(owner, flag):
                if isinstance(store.value, ast.Constant) and not store.value.value:
                    continue
                method, self_name = store.scope.node, store.scope.self_name
                if not isinstance(method, FUNCTIONS) or self_name is None:
                    return False
                block = _block_of(method, store.position[0])
                if not any(_stores(s, self_name, frozenset({attribute})) for s in block):
                    return False
        return True

    def assigned(self, binding: Binding, owner: ClassValue, instance: Instance) -> Values:
        """What ``self.<attribute> = value`` in a method of ``owner`` stores for
        ``instance``."""
        evaluator = self.evaluator
        if binding.value is None:
            return (UNKNOWN,)
        method = binding.scope
        node = method.node
        if (
            isinstance(node, FUNCTIONS)
            and node.name == "__init__"
            and instance.call is not None
            and instance.context is not None
            and method.parent is not None
        ):  # stored by the constructor: its parameters are what the instance was made with
            initialiser = FunctionValue(node, Context(owner.module, method.parent), (instance,))
            made = Arguments.of(instance.call, instance.context)
            values = evaluator.evaluate(binding.value, evaluator.bind(initialiser, made))
        else:
            self_parameter = first_parameter(node)
            env: Environment = ()
            if self_parameter is not None:
                env = ((self_parameter, Argument(None, None, (instance,))),)
            values = evaluator.evaluate(binding.value, evaluator.context(owner.module, method, env))
        for index in binding.path:  # ``self.stages, info = make_stages(...)``
            values = unique(
                v for value in values for v in evaluator.containers.item(value, index)
            ) or (UNKNOWN,)
        return values if binding.path else made_for(values, binding)

    def _class_member(self, cls: ClassValue, attribute: str, instance: Instance | None) -> Values:
        order = self.classes.mro(cls)
        if attribute == "apply" and any(
            isinstance(owner, External) and owner.name in AUTOGRAD_FUNCTIONS for owner in order
        ):
            own = self._first_member(order, attribute, instance)
            if not known(own):  # ``C.apply`` of a ``torch.autograd.Function``: torch's own
                return (Method(cls, "apply"),)
            return own
        return self._first_member(order, attribute, instance)

    def _first_member(
        self, owners: list[ClassValue | External], attribute: str, instance: Instance | None
    ) -> Values:
        """The member as the first of ``owners`` (an MRO, or its tail) that defines it; an
        external class on the way may define it too, so UNKNOWN."""
        evaluator = self.evaluator
        for owner in owners:
            if isinstance(owner, External):
                return (UNKNOWN,)
            scope = evaluator.scope_of(owner)
            bindings = scope.bindings.get(attribute)
            if not bindings:
                continue
            results: list[Value] = []
            class_context = Context(owner.module, scope)
            for binding in fold(bindings, None):
                node = binding.node
                if isinstance(node, FUNCTIONS):
                    function = FunctionValue(node, class_context)
                    results.append(_bind_method(function, instance, owner))
                else:
                    for value in evaluator.binding_values(binding, class_context):
                        results.append(_unwrap_descriptor(value, instance))
            return unique(results) or (UNKNOWN,)
        return (UNKNOWN,)

    def _super_member(self, value: Super, attribute: str) -> Values:
        mro = self.classes.mro
        instance = next((v for v in value.instance if isinstance(v, Instance)), None)
        order = mro(instance.cls) if instance and isinstance(instance.cls, ClassValue) else []
        if value.cls not in order:
            order = mro(value.cls)
        return self._first_member(order[order.index(value.cls) + 1 :], attribute, instance)

    def _external_instance_member(self, instance: Instance, attribute: str) -> Values:
        name = instance.cls.name  # type: ignore[union-attr]
        if name in MAPPING_CONTAINERS and instance.call is not None:
            return self.evaluator.containers.mapping_item(instance, Constant(attribute))
        if name in CONTAINERS and attribute in ("values", "items", "children", "modules", "keys"):
            return (Method(instance, attribute),)
        if name in CONTAINERS and attribute in ("named_children", "named_modules"):
            return (Method(instance, attribute),)
        if attribute == "__call__":
            return (instance,)
        if instance.origin is not None and instance.context is not None:
            assigned = self._attributes_set(instance.origin, attribute, instance.context)
            if assigned:  # ``down = nn.Module(); down.block = Block()``
                return assigned
        return (External(f"{name}.{attribute}"),)  # a method, by its qualified name

    def _attributes_set(self, origin: Binding, attribute: str, context: Context) -> Values:
        """Values assigned to ``<name>.<attribute>`` in the function that made ``name``."""
        module = context.module
        span = line_span(origin.scope.node if origin.scope.kind == "function" else None)
        results: list[Value] = []
        for line in module.lines_naming(origin.name, within=span):
            for statement, scope in statements_on_line(module, line):
                if not isinstance(statement, ast.Assign):
                    continue
                for target in statement.targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr == attribute
                        and isinstance(target.value, ast.Name)
                        and target.value.id == origin.name
                    ):
                        here = Context(module, scope, context.env if scope is origin.scope else ())
                        results.extend(self.evaluator.evaluate(statement.value, here))
        return unique(results)


def _bind_method(function: FunctionValue, instance: Instance | None, owner: ClassValue) -> Value:
    decorators = {_decorator_name(d) for d in function.node.decorator_list}  # type: ignore[union-attr]
    if "staticmethod" in decorators:
        return function
    if "classmethod" in decorators:
        return FunctionValue(function.node, function.context, (owner,))
    if instance is None:
        return function
    return FunctionValue(function.node, function.context, (instance,))


def _unwrap_descriptor(value: Value, instance: Instance | None) -> Value:
    """A function stored as a class attribute binds like a method (unless staticmethod)."""
    if isinstance(value, FunctionValue) and value.bound is None and instance is not None:
        if not isinstance(value.node, ast.Lambda) or value.node.args.args:
            return FunctionValue(value.node, value.context, (instance,))
    return value


def _decorator_name(decorator: ast.expr) -> str:
    while isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Attribute):
        return decorator.attr
    return decorator.id if isinstance(decorator, ast.Name) else ""


def _block_of(function: ast.FunctionDef | ast.AsyncFunctionDef, line: int) -> list[ast.stmt]:
    """The statement list of ``function`` that holds the statement at ``line``."""
    path = statements_at(function.body, line)
    return function.body if len(path) < 2 else body_containing(path[-2], line)


def _stores(statement: ast.stmt, self_name: str, attributes: frozenset[str]) -> bool:
    """``self.<one of attributes> = ...``."""
    return isinstance(statement, ast.Assign) and any(
        isinstance(t, ast.Attribute)
        and t.attr in attributes
        and isinstance(t.value, ast.Name)
        and t.value.id == self_name
        for t in statement.targets
    )


def _falsy(value: Value) -> bool:
    return isinstance(value, Constant) and not value.value
