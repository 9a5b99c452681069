//! The port contract suites on the real adapters: the run store on Redis, the queue on
//! RabbitMQ, the blob store on local files and on S3 (moto). The same suites run on the
//! embedded adapters in unit tests (`coordinator::store::memory`, `worker::memory_queue`,
//! `worker::blobs` over object_store's in-memory store). Every case uses a namespace of its
//! own.

use fleet_tests::stack::{unique_namespace, AMQP_URL, REDIS_URL};

mod run_store_on_redis {
    use super::*;
    use coordinator::store::conformance::Profile;
    use coordinator::store::redis::RedisRunStore;
    use std::time::Duration;

    fn profile() -> Profile {
        Profile {
            lease: Duration::from_millis(1500),
            list_limit: Some(1000),
        }
    }

    async fn fresh() -> RedisRunStore {
        RedisRunStore::connect(REDIS_URL, &unique_namespace("conf-store"))
            .await
            .expect("redis at 127.0.0.1:6379 (scripts/provision.sh)")
            .with_lease(profile().lease)
    }

    coordinator::run_store_conformance!(fresh().await, profile());
}

mod broker_on_rabbitmq {
    use super::*;
    use worker::queue::conformance as c;
    use worker::rabbitmq::RabbitBroker;

    /// A broker in a namespace of its own; its queues are deleted when the case ends.
    struct Fresh {
        broker: RabbitBroker,
        ns: String,
    }

    impl Drop for Fresh {
        fn drop(&mut self) {
            fleet_tests::stack::delete_queues(&self.ns);
        }
    }

    async fn fresh() -> Fresh {
        let ns = unique_namespace("conf-q");
        let broker = RabbitBroker::connect(AMQP_URL, &ns)
            .await
            .expect("rabbitmq at 127.0.0.1:5672 (scripts/provision.sh)")
            .with_affinity_wait(Some(std::time::Duration::from_secs(1)));
        Fresh { broker, ns }
    }

    macro_rules! cases {
        ($($case:ident),+ $(,)?) => {$(
            #[tokio::test]
            async fn $case() {
                let f = fresh().await;
                c::$case(&f.broker).await;
            }
        )+};
    }

    cases!(
        publish_then_subscribe_delivers_once_with_count_zero,
        requeue_redelivers_with_a_raised_count,
        reject_dead_letters_a_job,
        a_job_requeued_past_the_delivery_limit_is_dead_lettered,
        publish_many_delivers_all_in_order,
        queues_are_separate,
        a_consumer_that_goes_away_loses_no_message,
        broadcast_reaches_every_listener,
        jobs_of_a_held_image_go_to_its_holders,
        a_job_its_holders_leave_goes_on_to_the_jobs_queue,
    );
}

macro_rules! blob_cases {
    ($open:expr) => {
        use worker::blobs::conformance as c;

        #[tokio::test]
        async fn put_then_get_returns_the_bytes() {
            c::put_then_get_returns_the_bytes(&$open("a")).await;
        }
        #[tokio::test]
        async fn a_missing_key_is_not_found_and_permanent() {
            c::a_missing_key_is_not_found_and_permanent(&$open("a")).await;
        }
        #[tokio::test]
        async fn exists_and_delete() {
            c::exists_and_delete(&$open("a")).await;
        }
        #[tokio::test]
        async fn json_round_trips() {
            c::json_round_trips(&$open("a")).await;
        }
        #[tokio::test]
        async fn content_keys_are_checked() {
            c::content_keys_are_checked(&$open("a")).await;
        }
        #[tokio::test]
        async fn small_values_ride_inline_large_ones_are_stored() {
            c::small_values_ride_inline_large_ones_are_stored(&$open("a")).await;
        }
        #[tokio::test]
        async fn list_is_sorted_and_under_the_prefix() {
            c::list_is_sorted_and_under_the_prefix(&$open("a")).await;
        }
        #[tokio::test]
        async fn namespaces_do_not_see_each_other() {
            let open = $open;
            let (a, b) = (open("a"), open("b"));
            c::namespaces_do_not_see_each_other(&a, &b).await;
        }
    };
}

mod blobs_on_local_files {
    use worker::blobs::Blobs;

    /// Blobs over one temporary folder per case (removed with the closure), in as many
    /// namespaces as asked for.
    fn open() -> impl Fn(&str) -> Blobs {
        let dir = tempfile::tempdir().expect("a temp dir");
        move |ns: &str| {
            Blobs::open(&format!("file://{}", dir.path().display()), ns).expect("file store")
        }
    }

    blob_cases!(open());
}

mod blobs_on_s3 {
    use super::*;
    use worker::blobs::Blobs;

    /// Blobs in the `fleet` bucket of the local S3 (moto), under a namespace of its own.
    fn open() -> impl Fn(&str) -> Blobs {
        let base = unique_namespace("conf-blobs");
        move |ns: &str| fleet_tests::stack::s3_blobs(&format!("{base}/{ns}"))
    }

    blob_cases!(open());
}
