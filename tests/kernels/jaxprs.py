"""Walking traced programs: the structural tests' one helper."""


def equations(jaxpr):
    """Every equation of a jaxpr, including those inside nested jaxprs (jit, custom_vjp,
    scan and pallas_call bodies), depth first."""
    for eqn in jaxpr.eqns:
        yield eqn
        for val in eqn.params.values():
            for sub in val if isinstance(val, (tuple, list)) else (val,):
                if hasattr(sub, "eqns"):
                    yield from equations(sub)
                elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from equations(sub.jaxpr)
