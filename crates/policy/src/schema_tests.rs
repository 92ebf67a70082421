//! Tests of the schema types: k8s-openapi's JSON shapes, reading exported objects.

use crate::parse::parse;
use crate::schema::*;
use serde_json::Value;

fn one(input: &str) -> NetworkPolicy {
    let mut v = parse(input).unwrap_or_else(|e| panic!("{e}\n{input}"));
    assert_eq!(v.len(), 1);
    v.remove(0).object
}

const HEAD: &str =
    "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n";

/// An object as `kubectl get networkpolicy -o yaml` prints it, server-set fields and all.
const KUBECTL: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"annotations":{},"name":"web-allow","namespace":"prod"},"spec":{"podSelector":{"matchLabels":{"app":"web"}}}}
  creationTimestamp: "2024-05-01T10:00:00Z"
  generation: 3
  labels:
    app: web
  managedFields:
  - apiVersion: networking.k8s.io/v1
    fieldsType: FieldsV1
    fieldsV1:
      f:metadata:
        f:annotations:
          .: {}
          f:kubectl.kubernetes.io/last-applied-configuration: {}
      f:spec:
        f:ingress: {}
        f:podSelector: {}
        f:policyTypes: {}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2024-05-01T10:00:00Z"
  name: web-allow
  namespace: prod
  resourceVersion: "123456"
  uid: 6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f
spec:
  ingress:
  - from:
    - podSelector:
        matchLabels:
          app: client
    ports:
    - port: 8080
      protocol: TCP
  podSelector:
    matchLabels:
      app: web
  policyTypes:
  - Ingress
"#;

#[test]
fn a_kubectl_export_reads_with_its_server_fields() {
    let parsed = parse(KUBECTL).unwrap();
    assert_eq!(parsed.len(), 1);
    let (o, p) = (&parsed[0].object, &parsed[0].policy);
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str()),
        ("prod", "web-allow")
    );
    let m = &o.metadata;
    assert_eq!(
        m.uid.as_deref(),
        Some("6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f")
    );
    assert_eq!(m.resource_version.as_deref(), Some("123456"));
    assert_eq!(
        m.creation_timestamp.as_deref(),
        Some("2024-05-01T10:00:00Z")
    );
    assert_eq!(m.generation, Some(3));
    assert!(m
        .annotations
        .as_ref()
        .unwrap()
        .contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    assert_eq!(
        m.managed_fields.as_ref().unwrap()[0]["manager"],
        "kubectl-client-side-apply"
    );
    // Written back, it is the input.
    let input = crate::yaml::documents(KUBECTL).unwrap().remove(0);
    assert_eq!(serde_json::to_value(o).unwrap(), input);
}

/// What k8s-openapi 0.29 (`latest`) wrote for, or how [`parse`] failed on, each input:
/// the upstream cases, the field shapes, `null`s, absent required fields and unknown
/// fields. Written back, the objects must be the same bytes.
const K8S_OPENAPI: &str = include_str!("../tests/data/k8s-openapi-0.29.json");

#[test]
fn objects_are_written_as_k8s_openapi_wrote_them() {
    let entries: Vec<Value> = serde_json::from_str(K8S_OPENAPI).unwrap();
    assert!(entries.len() > 40);
    for e in &entries {
        let (name, input) = (e["name"].as_str().unwrap(), e["input"].as_str().unwrap());
        match (&e["objects"], &e["error"]) {
            (Value::Array(want), _) => {
                let got = parse(input).unwrap_or_else(|err| panic!("{name}: {err}"));
                assert_eq!(got.len(), want.len(), "{name}");
                for (g, w) in got.iter().zip(want) {
                    let w = w.as_str().unwrap();
                    assert_eq!(serde_json::to_string(&g.object).unwrap(), w, "{name}");
                    assert_eq!(
                        serde_json::to_value(&g.object).unwrap(),
                        serde_json::from_str::<Value>(w).unwrap(),
                        "{name}"
                    );
                }
            }
            (_, Value::String(want)) => {
                let got = match parse(input) {
                    Ok(_) => panic!("{name}: parsed, want {want}"),
                    Err(err) => err.to_string(),
                };
                assert_eq!(&got, want, "{name}");
            }
            _ => panic!("{name}: neither objects nor error"),
        }
    }
}

#[test]
fn a_port_is_a_number_a_name_or_a_range() {
    let o = one(&format!(
            "{HEAD}spec:\n  ingress:\n  - ports: [{{port: 80}}, {{port: http}}, {{port: 8000, endPort: 8080, protocol: UDP}}]\n"
        ));
    let ports = o.spec.unwrap().ingress.unwrap()[0].ports.clone().unwrap();
    assert_eq!(ports[0].port, Some(IntOrString::Int(80)));
    assert_eq!(ports[1].port, Some(IntOrString::String("http".into())));
    assert_eq!(
        ports[2],
        NetworkPolicyPort {
            end_port: Some(8080),
            port: Some(IntOrString::Int(8000)),
            protocol: Some("UDP".into()),
        }
    );
    assert_eq!(
        serde_json::to_string(&ports).unwrap(),
        r#"[{"port":80},{"port":"http"},{"endPort":8080,"port":8000,"protocol":"UDP"}]"#
    );
}

#[test]
fn an_unknown_field_fails_with_its_path() {
    for (spec, path) in [
        (
            "spec:\n  ingress:\n  - ports: [{port: 80, end_port: 81}]\n",
            "spec.ingress[0].ports[0].end_port",
        ),
        (
            "spec:\n  egress:\n  - to: [{ipBlock: {cidr: 10.0.0.0/8, excepts: []}}]\n",
            "spec.egress[0].to[0].ipBlock.excepts",
        ),
        ("status: {}\n", "status"),
    ] {
        let e = parse(&format!("{HEAD}{spec}")).unwrap_err();
        assert_eq!(e.path, path, "{spec}");
        assert!(e.message.starts_with("unknown field"), "{e}");
    }
    let e = parse(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, nmae: q}\n",
    )
    .unwrap_err();
    assert_eq!(e.path, "metadata.nmae");
}

#[test]
fn a_struct_is_read_from_a_map_never_from_its_fields_in_order() {
    let e = parse(&format!(
        "{HEAD}spec:\n  egress:\n  - to: [[{{cidr: 10.0.0.0/8}}]]\n"
    ))
    .unwrap_err();
    assert_eq!(e.path, "spec.egress[0].to[0]");
    assert_eq!(
        e.message,
        "invalid type: sequence, expected NetworkPolicyPeer"
    );
    let e = parse(&format!("{HEAD}spec: [null, null, {{}}]\n")).unwrap_err();
    assert_eq!(e.path, "spec");
}

#[test]
fn the_type_fields_are_checked_when_read_and_always_written() {
    let e =
        serde_json::from_str::<NetworkPolicy>(r#"{"apiVersion":"v1","metadata":{}}"#).unwrap_err();
    assert!(
        e.to_string().contains("expected networking.k8s.io/v1"),
        "{e}"
    );
    let e = serde_json::from_str::<NetworkPolicy>(r#"{"kind":"Pod"}"#).unwrap_err();
    assert!(e.to_string().contains("expected NetworkPolicy"), "{e}");
    let o: NetworkPolicy = serde_json::from_str(r#"{"metadata":null}"#).unwrap();
    assert_eq!(o, NetworkPolicy::default());
    assert_eq!(
        serde_json::to_string(&o).unwrap(),
        r#"{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{}}"#
    );
}
