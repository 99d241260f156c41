//! Proves the kit provides real servers: a CRD accepted by kube-apiserver with a custom
//! object created, read back and its status patched through the status subresource; an
//! etcd key on a lease that disappears when the lease expires, seen by a watch; a
//! JetStream stream whose message a consumer replays from the start.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream::{self, consumer, stream};
use etcd_client::{EventType, PutOptions, WatchOptions};
use futures::StreamExt;
use infera_testkit::{etcd_client, kube_client, nats_client, unique_name};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use std::time::Duration;

fn mk_crd(group: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "properties": {
                            "size": {"type": "integer", "minimum": 1}
                        }, "required": ["size"]},
                        "status": {"type": "object", "properties": {
                            "phase": {"type": "string"}
                        }}
                    }
                }}
            }]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn kube_apiserver_serves_a_crd_with_status_subresource() {
    let client = kube_client().await.unwrap();
    let group = format!("{}.testkit.example", unique_name("g"));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &mk_crd(&group))
        .await
        .unwrap();
    let crd_name = crd.metadata.name.unwrap();
    infera_testkit::kube_apiserver::wait_established(&client, &crd_name)
        .await
        .unwrap();

    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar);

    // The schema is enforced by the real server.
    let invalid: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "too-small"}, "spec": {"size": 0}
    }))
    .unwrap();
    let err = widgets
        .create(&PostParams::default(), &invalid)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.size"), "{err}");

    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "fixture-widget"}, "spec": {"size": 3}
    }))
    .unwrap();
    widgets.create(&PostParams::default(), &obj).await.unwrap();
    let read = widgets.get("fixture-widget").await.unwrap();
    assert_eq!(read.data["spec"]["size"], 3);

    // Status goes through the status subresource; a status change in a main-resource
    // patch is ignored by the server.
    widgets
        .patch(
            "fixture-widget",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "ignored"}})),
        )
        .await
        .unwrap();
    assert!(
        widgets
            .get("fixture-widget")
            .await
            .unwrap()
            .data
            .get("status")
            .is_none()
    );
    let patched = widgets
        .patch_status(
            "fixture-widget",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["phase"], "Ready");
    assert_eq!(
        widgets.get("fixture-widget").await.unwrap().data["status"]["phase"],
        "Ready"
    );

    crds.delete(&crd_name, &Default::default()).await.unwrap();
}

#[tokio::test]
async fn etcd_lease_expiry_deletes_the_key_and_a_watch_sees_it() {
    let mut client = etcd_client().await.unwrap();
    let key = format!("/testkit/{}/worker", unique_name("lease"));
    let lease = client.lease_grant(2, None).await.unwrap();
    client
        .put(
            key.as_str(),
            "fixture-record",
            Some(PutOptions::new().with_lease(lease.id())),
        )
        .await
        .unwrap();
    let got = client.get(key.as_str(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"fixture-record");
    let rev = got.header().unwrap().revision();

    let mut stream = client
        .watch(
            key.as_str(),
            Some(WatchOptions::new().with_start_revision(rev + 1)),
        )
        .await
        .unwrap();
    // No keepalive: the lease (2 s TTL) must expire and take the key with it.
    let event = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let resp = stream.message().await.unwrap().expect("watch stream ended");
            if let Some(ev) = resp.events().first() {
                return (ev.event_type(), ev.kv().map(|kv| kv.key().to_vec()));
            }
        }
    })
    .await
    .expect("no delete event within 15 s of a 2 s lease");
    assert_eq!(event.0, EventType::Delete);
    assert_eq!(event.1.as_deref(), Some(key.as_bytes()));
    assert!(
        client
            .get(key.as_str(), None)
            .await
            .unwrap()
            .kvs()
            .is_empty()
    );
}

#[tokio::test]
async fn jetstream_stream_replays_from_the_start() {
    let client = nats_client().await.unwrap();
    let js = jetstream::new(client);
    let name = unique_name("TESTKIT").replace('-', "_");
    let subject = format!("testkit.{name}.events");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("testkit.{name}.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .unwrap();
    for i in 0..3 {
        js.publish(subject.clone(), format!("batch-{i}").into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // A consumer created after the messages were published replays them all, in order.
    let stream = js.get_stream(&name).await.unwrap();
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.fetch().max_messages(3).messages().await.unwrap();
    let mut got = Vec::new();
    while let Some(msg) = messages.next().await {
        let msg = msg.unwrap();
        got.push(String::from_utf8(msg.payload.to_vec()).unwrap());
        msg.ack().await.unwrap();
    }
    assert_eq!(got, vec!["batch-0", "batch-1", "batch-2"]);
    js.delete_stream(&name).await.unwrap();
}
