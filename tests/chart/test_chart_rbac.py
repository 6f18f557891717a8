"""The chart's RBAC is the operator's one rules file (rbac/operator-rules.yaml), exactly: cluster-wide by default,
per watched namespace otherwise; kopf's peering objects only with peering; never anything on Secrets; and the write
guard (templates/rbac/write-guard.yaml) over every child kind."""

from __future__ import annotations

import yaml

import chart_sync
from chart_objects import find, find_one, objects

RULES = yaml.safe_load((chart_sync.ROOT / "rbac" / "operator-rules.yaml").read_text())


def peering_rule(resource: str) -> dict:
    return {"apiGroups": ["kopf.dev"], "resources": [resource], "verbs": ["get", "list", "watch", "patch"]}


def test_cluster_wide_role_is_every_rule_of_the_file(rendered):
    role = find_one(rendered["defaults"], "ClusterRole")
    assert role["rules"] == RULES["namespaced"] + RULES["cluster"]
    assert find(rendered["defaults"], "Role") == []
    binding = find_one(rendered["defaults"], "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "neuronmodel-operator",
                                    "namespace": chart_sync.NAMESPACE}]


def test_watch_namespaces_gives_one_role_each_and_only_cluster_rules_cluster_wide(rendered):
    docs = rendered["namespaced"]
    assert find_one(docs, "ClusterRole")["rules"] == RULES["cluster"] + RULES["namespace_scope"]
    roles = {role["metadata"]["namespace"]: role for role in find(docs, "Role")}
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert role["rules"] == RULES["namespaced"]
    bindings = {binding["metadata"]["namespace"]: binding for binding in find(docs, "RoleBinding")}
    assert sorted(bindings) == ["team-a", "team-b"]
    for namespace, binding in bindings.items():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": roles[namespace]["metadata"]["name"]}
        assert binding["subjects"][0]["namespace"] == chart_sync.NAMESPACE


def test_peering_adds_exactly_the_peering_objects_rule(rendered):
    cluster = find_one(rendered["peering"], "ClusterRole")["rules"]
    assert cluster == RULES["namespaced"] + [peering_rule("clusterkopfpeerings")] + RULES["cluster"]
    docs = rendered["peering-namespaced"]
    assert find_one(docs, "ClusterRole")["rules"] == RULES["cluster"] + RULES["namespace_scope"]
    assert find_one(docs, "Role")["rules"] == RULES["namespaced"] + [peering_rule("kopfpeerings")]


def test_no_rule_names_secrets_or_wildcards(rendered):
    for case, docs in rendered.items():
        for role in find(docs, "ClusterRole") + find(docs, "Role"):
            for rule in role["rules"]:
                assert "secrets" not in rule["resources"], (case, role["kind"], rule)
                assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"], (case, rule)


def test_rbac_create_false_renders_no_rbac(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("rbac: {create: false}\nserviceAccount: {create: false, name: existing}\n"
                      "watchNamespaces: [team-a]\n")
    out = chart_sync.render(values)
    assert out.returncode == 0, out.stderr
    docs = objects(out.stdout)
    assert sorted(doc["kind"] for doc in docs) == ["Deployment"]
    assert find_one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def test_the_write_guard_covers_every_kind_the_operator_may_delete_and_only_its_service_account(rendered):
    """Every child kind (a rule with `delete`) is under the guard, so a new child kind cannot slip past it; the
    NeuronModels and Events the operator writes but did not make are not."""
    policy = find_one(rendered["defaults"], "ValidatingAdmissionPolicy")
    guarded = {(group, resource) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
               for group in rule["apiGroups"] for resource in rule["resources"]}
    deletable = {(group, resource) for rule in RULES["namespaced"] if "delete" in rule["verbs"]
                 for group in rule["apiGroups"] for resource in rule["resources"]}
    assert guarded == deletable and ("apps", "deployments") in guarded and ("", "configmaps") in guarded
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{chart_sync.NAMESPACE}:neuronmodel-operator"')
    binding = find_one(rendered["defaults"], "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_write_guard_can_be_turned_off(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("rbac: {writeGuard: {enabled: false}}\n")
    out = chart_sync.render(values)
    assert out.returncode == 0, out.stderr
    kinds = {doc["kind"] for doc in objects(out.stdout)}
    assert "ClusterRole" in kinds and not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
