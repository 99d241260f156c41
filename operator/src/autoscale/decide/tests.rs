use super::*;
use proptest::prelude::*;

fn policy() -> Policy {
    Policy {
        min: 1,
        max: 8,
        targets: AutoscalingTargets {
            ttft_p90_seconds: Some(0.5),
            itl_p90_seconds: Some(0.05),
            waiting_per_worker: Some(2.0),
            kv_usage: None,
        },
        up_window: 0.0,
        down_window: 30.0,
    }
}

fn role(role: Role, current: u32, waiting: f64) -> RoleSignals {
    RoleSignals {
        role,
        current,
        ready: current,
        settled: true,
        waiting: Some(waiting),
        kv_usage: None,
        running: None,
        seats: None,
        complete: true,
    }
}

fn signals(ttft: Option<f64>, itl: Option<f64>, roles: Vec<RoleSignals>) -> Signals {
    Signals {
        ttft_p90: ttft,
        itl_p90: itl,
        prefill_p90: None,
        roles,
        rollout: false,
    }
}

fn desired(d: &[RoleDecision], r: Role) -> u32 {
    d.iter().find(|x| x.role == r).unwrap().desired
}

#[test]
fn one_look_recommends_by_the_highest_ratio() {
    let p = policy();
    // (ttft, itl, current, waiting) -> workers
    type Row = (Option<f64>, Option<f64>, u32, f64, u32);
    let table: [Row; 9] = [
        // TTFT 2x its target: twice the workers.
        (Some(1.0), Some(0.01), 2, 0.0, 4),
        // 10x over, but at most double (plus one) in one step.
        (Some(5.0), None, 2, 0.0, 4),
        (Some(5.0), None, 1, 0.0, 2),
        // 8 waiting on 2 workers: 4 per worker against 2.
        (Some(0.1), None, 2, 8.0, 4),
        // Within 10%: as is.
        (Some(0.52), None, 3, 0.0, 3),
        // Well under, nothing waiting: fewer, at most half of them at once.
        (Some(0.1), Some(0.01), 4, 0.0, 2),
        (Some(0.3), None, 4, 0.0, 2),
        // Under, but requests wait: as is.
        (Some(0.1), None, 4, 1.0, 4),
        // No traffic at all and idle engines: half.
        (None, None, 3, 0.0, 2),
    ];
    for (ttft, itl, current, waiting, want) in table {
        let s = signals(ttft, itl, vec![role(Role::Mixed, current, waiting)]);
        let (got, why) = recommend(&p, &s, &s.roles[0]);
        assert_eq!(
            got, want,
            "ttft {ttft:?} itl {itl:?} at {current} with {waiting} waiting: {why}"
        );
    }
}

#[test]
fn scale_in_never_goes_below_what_requests_in_flight_need() {
    let p = policy();
    // Latency is far under target on 4 workers, but 7 requests run and a worker was
    // seen to queue at 2: 4 are needed.
    let busy = RoleSignals {
        running: Some(7.0),
        seats: Some(2.0),
        ..role(Role::Mixed, 4, 0.0)
    };
    let s = signals(Some(0.02), None, vec![busy.clone()]);
    let (n, why) = recommend(&p, &s, &s.roles[0]);
    assert_eq!(n, 4, "{why}");
    assert!(why.contains("7 requests in flight need 4 workers"), "{why}");
    // 3 in flight fit on 2.
    let lighter = RoleSignals {
        running: Some(3.0),
        ..busy.clone()
    };
    let s = signals(Some(0.02), None, vec![lighter]);
    assert_eq!(recommend(&p, &s, &s.roles[0]).0, 2);
    // Seats not learnt yet: the queue's spread, at most half at once.
    let unknown = RoleSignals {
        seats: None,
        ..busy
    };
    let s = signals(Some(0.02), None, vec![unknown]);
    assert_eq!(recommend(&p, &s, &s.roles[0]).0, 2);
}

#[test]
fn a_missed_latency_target_marks_the_role_saturated_a_queue_does_not() {
    let p = policy();
    let s = signals(Some(1.0), None, vec![role(Role::Prefill, 1, 0.0)]);
    assert!(over_latency_target(&p.targets, &s, &s.roles[0]));
    let s = signals(Some(0.52), None, vec![role(Role::Prefill, 1, 9.0)]);
    assert!(!over_latency_target(&p.targets, &s, &s.roles[0]));
}

#[test]
fn latency_alone_lets_one_worker_leave_at_a_time() {
    let p = Policy {
        targets: AutoscalingTargets {
            ttft_p90_seconds: Some(0.36),
            ..Default::default()
        },
        ..policy()
    };
    // TTFT is flat once workers are not saturated: 0.235 s on 2 workers (0.65 of the
    // target) says nothing of 1; still, one may leave.
    let s = signals(Some(0.235), None, vec![role(Role::Mixed, 2, 0.0)]);
    assert_eq!(recommend(&p, &s, &s.roles[0]).0, 1);
    let s = signals(Some(0.1), None, vec![role(Role::Mixed, 5, 0.0)]);
    assert_eq!(recommend(&p, &s, &s.roles[0]).0, 4);
    // A queue or KV usage spreads: with them, as many leave as they allow (at most half).
    let with_kv = Policy {
        targets: AutoscalingTargets {
            ttft_p90_seconds: Some(0.36),
            kv_usage: Some(0.8),
            ..Default::default()
        },
        ..policy()
    };
    let s = Signals {
        roles: vec![RoleSignals {
            kv_usage: Some(0.2),
            ..role(Role::Mixed, 8, 0.0)
        }],
        ..signals(Some(0.1), None, Vec::new())
    };
    // 8 × 0.25 / 0.9 = 2.2 -> 3, but no more than half leave: 4.
    assert_eq!(recommend(&with_kv, &s, &s.roles[0]).0, 4);
}

#[test]
fn reasons_name_the_signal_and_the_target() {
    let s = signals(Some(1.0), None, vec![role(Role::Mixed, 2, 0.0)]);
    let (_, why) = recommend(&policy(), &s, &s.roles[0]);
    assert_eq!(why, "TTFT p90 (s) 1 against a target of 0.5");
    let s = Signals {
        roles: vec![RoleSignals {
            waiting: None,
            ..role(Role::Mixed, 2, 0.0)
        }],
        ..signals(None, None, Vec::new())
    };
    assert_eq!(
        recommend(&policy(), &s, &s.roles[0]),
        (2, "no signal with a target".into())
    );
}

#[test]
fn prefill_load_scales_prefill_and_decode_load_scales_decode() {
    // (what, ttft, itl, prefill waiting, decode waiting) -> (prefill, decode), from
    // 1 prefill and 2 decode workers.
    let table = [
        // Long prompts: prefill queues, TTFT over target, decode streams at its target.
        ("prefill-bound", Some(1.5), Some(0.047), 3.0, 0.0, (2, 2)),
        // Long answers: decode's seats are full and its queue grows; TTFT counts for
        // decode (its queue delays the first token), prefill stays.
        ("decode-bound", Some(1.5), Some(0.02), 0.0, 6.0, (1, 4)),
        // Slow tokens are decode's.
        ("slow tokens", Some(0.2), Some(0.1), 0.0, 0.0, (1, 4)),
    ];
    for (what, ttft, itl, prefill, decode, want) in table {
        let s = signals(
            ttft,
            itl,
            vec![
                role(Role::Prefill, 1, prefill),
                role(Role::Decode, 2, decode),
            ],
        );
        let (d, _) = decide(&policy(), &s, &History::new(), 0.0);
        let got = (desired(&d, Role::Prefill), desired(&d, Role::Decode));
        assert_eq!(got, want, "{what}: {d:?}");
    }
}

#[test]
fn ttft_is_not_prefill_s_when_its_legs_were_quick() {
    // (what, ttft, prefill legs, decode waiting) -> (prefill, decode), from 1 prefill
    // and 2 decode workers; the TTFT target is 0.5.
    let table = [
        // Prefill's legs take most of the TTFT: prefill out by the TTFT's ratio.
        ("prefill queue", 1.5, 1.4, 0.0, (2, 2)),
        // Legs over half the target: prefill's, though part of the wait was elsewhere.
        ("prefill busy", 0.8, 0.3, 0.0, (2, 2)),
        // The first token waited for a decode seat, none queued as the engines were
        // scraped; prefill's legs were quick: no prefill worker would help.
        ("decode seat", 0.6, 0.05, 0.0, (1, 2)),
        // Decode's queue: the TTFT is decode's.
        ("decode queue", 1.5, 0.05, 6.0, (1, 4)),
    ];
    for (what, ttft, legs, decode, want) in table {
        let s = Signals {
            prefill_p90: Some(legs),
            // Decode streams at its inter-token target.
            ..signals(
                Some(ttft),
                Some(0.047),
                vec![role(Role::Prefill, 1, 0.0), role(Role::Decode, 2, decode)],
            )
        };
        let (d, _) = decide(&policy(), &s, &History::new(), 0.0);
        let got = (desired(&d, Role::Prefill), desired(&d, Role::Decode));
        assert_eq!(got, want, "{what}: {d:?}");
    }
}

#[test]
fn scale_in_waits_for_the_window_and_says_when() {
    let p = policy();
    let busy = signals(Some(0.5), None, vec![role(Role::Mixed, 4, 0.0)]);
    let idle = signals(Some(0.05), None, vec![role(Role::Mixed, 4, 0.0)]);
    let (d, h) = decide(&p, &busy, &History::new(), 100.0);
    assert_eq!(d[0].desired, 4);
    // 10 s later the load is gone: the window still holds the busy look.
    let (d, h) = decide(&p, &idle, &h, 110.0);
    assert_eq!(d[0].desired, 4, "{}", d[0].reason);
    assert_eq!(d[0].next_scale_in, Some(130.0));
    assert!(d[0].reason.contains("scale-down window"), "{}", d[0].reason);
    // Once the busy look is older than the window: in (half at once).
    let (d, _) = decide(&p, &idle, &h, 131.0);
    assert_eq!(d[0].desired, 2, "{}", d[0].reason);
}

#[test]
fn scale_up_waits_for_its_window_when_one_is_set() {
    let p = Policy {
        up_window: 20.0,
        ..policy()
    };
    let calm = signals(Some(0.45), None, vec![role(Role::Mixed, 2, 0.0)]);
    let hot = signals(Some(1.0), None, vec![role(Role::Mixed, 2, 0.0)]);
    let (_, h) = decide(&p, &calm, &History::new(), 0.0);
    let (d, h) = decide(&p, &hot, &h, 10.0);
    assert_eq!(
        d[0].desired, 2,
        "a spike shorter than the window: {}",
        d[0].reason
    );
    let (d, _) = decide(&p, &hot, &h, 25.0);
    assert_eq!(d[0].desired, 4, "{}", d[0].reason);
}

#[test]
fn nothing_changes_during_a_rollout_and_none_are_added_before_new_ones_are_ready() {
    let p = policy();
    let mut s = signals(Some(2.0), None, vec![role(Role::Mixed, 2, 0.0)]);
    s.rollout = true;
    let (d, _) = decide(&p, &s, &History::new(), 0.0);
    assert_eq!(d[0].desired, 2);
    assert!(
        d[0].reason.starts_with("holding while a rollout runs"),
        "{}",
        d[0].reason
    );
    let s = Signals {
        roles: vec![RoleSignals {
            ready: 1,
            settled: false,
            ..role(Role::Mixed, 2, 0.0)
        }],
        ..signals(Some(2.0), None, Vec::new())
    };
    let (d, _) = decide(&p, &s, &History::new(), 0.0);
    assert_eq!(d[0].desired, 2);
    assert!(
        d[0].reason.contains("1 of 2 workers are ready"),
        "{}",
        d[0].reason
    );
    // Ready, but not yet for two looks: its traffic is not in the signals yet.
    let s = Signals {
        roles: vec![RoleSignals {
            settled: false,
            ..role(Role::Mixed, 2, 0.0)
        }],
        ..signals(Some(2.0), None, Vec::new())
    };
    let (d, _) = decide(&p, &s, &History::new(), 0.0);
    assert_eq!(d[0].desired, 2);
    assert!(
        d[0].reason.contains("the workers added last settle"),
        "{}",
        d[0].reason
    );
    // A worker that cannot start does not pin the count: fewer are still possible.
    let idle = Signals {
        roles: vec![RoleSignals {
            ready: 1,
            settled: false,
            ..role(Role::Mixed, 2, 0.0)
        }],
        ..signals(Some(0.01), None, Vec::new())
    };
    let (d, _) = decide(
        &Policy {
            down_window: 0.0,
            ..p
        },
        &idle,
        &History::new(),
        0.0,
    );
    assert_eq!(d[0].desired, 1, "{}", d[0].reason);
}

#[test]
fn a_partial_scrape_never_scales_in() {
    let s = Signals {
        roles: vec![RoleSignals {
            complete: false,
            ..role(Role::Mixed, 3, 0.0)
        }],
        ..signals(Some(0.01), None, Vec::new())
    };
    let (n, why) = recommend(&policy(), &s, &s.roles[0]);
    assert_eq!(n, 3);
    assert!(why.contains("not every engine answered"), "{why}");
    // ... but it still scales out on what it saw.
    let s = Signals {
        roles: vec![RoleSignals {
            complete: false,
            ..role(Role::Mixed, 3, 0.0)
        }],
        ..signals(Some(1.0), None, Vec::new())
    };
    assert_eq!(recommend(&policy(), &s, &s.roles[0]).0, 6);
}

#[test]
fn bounds_hold_even_without_load() {
    let p = Policy {
        min: 2,
        max: 3,
        ..policy()
    };
    // Above the maximum and idle: the maximum (half would be 3 too).
    let s = signals(None, None, vec![role(Role::Mixed, 6, 0.0)]);
    let (d, _) = decide(&p, &s, &History::new(), 0.0);
    assert_eq!(d[0].desired, 3);
    // Above the maximum and busy: the maximum.
    let s = signals(Some(0.5), None, vec![role(Role::Mixed, 6, 0.0)]);
    let (d, _) = decide(&p, &s, &History::new(), 0.0);
    assert_eq!(d[0].desired, 3);
    let s = signals(Some(5.0), None, vec![role(Role::Mixed, 3, 0.0)]);
    let (d, _) = decide(&p, &s, &History::new(), 0.0);
    assert_eq!(d[0].desired, 3);
    assert!(d[0].reason.contains("at the maximum"), "{}", d[0].reason);
}

fn any_role() -> impl Strategy<Value = RoleSignals> {
    (
        prop_oneof![Just(Role::Mixed), Just(Role::Prefill), Just(Role::Decode)],
        0u32..20,
        0u32..20,
        proptest::option::of(0.0f64..50.0),
        proptest::option::of(0.0f64..1.0),
        proptest::option::of(0.0f64..64.0),
        proptest::option::of(1.0f64..8.0),
        any::<bool>(),
    )
        .prop_map(
            |(role, current, ready, waiting, kv_usage, running, seats, complete)| RoleSignals {
                role,
                current,
                ready: ready.min(current),
                settled: ready >= current,
                waiting,
                kv_usage,
                running,
                seats,
                complete,
            },
        )
}

fn any_policy() -> impl Strategy<Value = Policy> {
    (
        1u32..6,
        0u32..10,
        proptest::option::of(0.01f64..2.0),
        proptest::option::of(0.001f64..0.2),
        proptest::option::of(0.1f64..8.0),
        proptest::option::of(0.05f64..1.0),
        0.0f64..60.0,
        0.0f64..120.0,
    )
        .prop_map(|(min, extra, ttft, itl, waiting, kv, up, down)| Policy {
            min,
            max: min + extra,
            targets: AutoscalingTargets {
                ttft_p90_seconds: ttft,
                itl_p90_seconds: itl,
                waiting_per_worker: waiting,
                kv_usage: kv,
            },
            up_window: up,
            down_window: down,
        })
}

fn any_signals() -> impl Strategy<Value = Signals> {
    (
        proptest::option::of(0.0f64..10.0),
        proptest::option::of(0.0f64..1.0),
        proptest::option::of(0.0f64..10.0),
        proptest::collection::vec(any_role(), 1..3),
        any::<bool>(),
    )
        .prop_map(|(ttft_p90, itl_p90, prefill_p90, roles, rollout)| Signals {
            ttft_p90,
            itl_p90,
            prefill_p90,
            roles,
            rollout,
        })
}

fn any_history() -> impl Strategy<Value = Vec<(f64, u32)>> {
    proptest::collection::vec((0.0f64..200.0, 0u32..20), 0..6)
}

proptest! {
    #[test]
    fn decisions_keep_every_promise(
        p in any_policy(),
        s in any_signals(),
        past in any_history(),
        now in 200.0f64..400.0,
    ) {
        let history: History = s.roles.iter().map(|r| (r.role, past.clone())).collect();
        let (decisions, next) = decide(&p, &s, &history, now);
        prop_assert_eq!(decisions.len(), s.roles.len());
        for (d, r) in decisions.iter().zip(&s.roles) {
            if s.rollout {
                // Never during a rollout.
                prop_assert_eq!(d.desired, r.current, "{}", &d.reason);
                continue;
            }
            if !r.settled {
                // No more before the added ones are ready and routed to.
                prop_assert!(d.desired <= r.current, "{}", &d.reason);
            }
            if !r.complete && r.current <= p.max {
                // Never in on a partial view.
                prop_assert!(d.desired >= r.current.min(p.max), "{}", &d.reason);
            }
            if (p.min..=p.max).contains(&r.current) {
                prop_assert!((p.min..=p.max).contains(&d.desired), "{} {:?}", &d.reason, p);
            }
            // Never in below what the requests in flight need.
            if let Some(seats) = r.seats && r.current <= p.max {
                let in_flight = r.running.unwrap_or(0.0) + r.waiting.unwrap_or(0.0);
                let need = ((in_flight / seats).ceil() as u32).clamp(p.min, p.max);
                prop_assert!(
                    d.desired >= need.min(r.current),
                    "{} in flight at {} seats: {} -> {}: {}",
                    in_flight, seats, r.current, d.desired, &d.reason
                );
            }
            // Never in while requests wait in the role.
            if r.waiting.unwrap_or(0.0) > 0.0 && r.current <= p.max {
                prop_assert!(d.desired >= r.current.min(p.max), "{}", &d.reason);
            }
            // At most double plus one in one step (unless lifted to the minimum).
            let cap = (r.current * 2).max(r.current + 1).max(p.min);
            prop_assert!(d.desired <= cap, "{} -> {}: {}", r.current, d.desired, &d.reason);
            // The history keeps this look, and nothing older than the longest window.
            let kept = &next[&r.role];
            prop_assert!(kept.iter().any(|(t, _)| *t == now));
            prop_assert!(kept.iter().all(|(t, _)| now - t <= p.up_window.max(p.down_window)));
        }
    }

    #[test]
    fn more_pressure_never_means_fewer_workers(
        p in any_policy(),
        s in any_signals(),
        factor in 1.0f64..10.0,
    ) {
        let mut s = s;
        s.rollout = false;
        for r in &mut s.roles {
            r.ready = r.current;
        }
        let hotter = Signals {
            ttft_p90: s.ttft_p90.map(|v| v * factor),
            itl_p90: s.itl_p90.map(|v| v * factor),
            prefill_p90: s.prefill_p90.map(|v| v * factor),
            roles: s
                .roles
                .iter()
                .map(|r| RoleSignals {
                    waiting: r.waiting.map(|v| v * factor),
                    kv_usage: r.kv_usage.map(|v| (v * factor).min(1.0)),
                    ..r.clone()
                })
                .collect(),
            rollout: false,
        };
        for (calm, hot) in s.roles.iter().zip(&hotter.roles) {
            let (a, _) = recommend(&p, &s, calm);
            let (b, _) = recommend(&p, &hotter, hot);
            prop_assert!(b >= a, "{:?} gave {} but {:?} gave {}", calm, a, hot, b);
        }
    }
}
