// Tailgate wire contract: the one IDL shared by the gateway, GPU task servers
// and edge agents.
//
// Transport: one long-lived TCP connection per (gateway, task server) pair,
// TFramedTransport + TBinaryProtocol. The connection is duplex:
//   gateway -> server: TaskServer calls (submit/cancel are oneway, so
//                      thousands of tasks can be outstanding on one socket);
//   server -> gateway: TaskSink.result oneway messages on the same socket,
//                      plus the replies to the two-way calls (status, ping).
// A stock Thrift client with a framed binary transport can call status() and
// ping() and send submit()/cancel(); it just never reads the result messages.
//
// Time: hosts share no clock. Deadlines travel as remaining budgets and
// results carry durations, always in milliseconds (`_ms`).

namespace py tailgate

enum TaskStatus {
  OK = 0,          // executed, `result` holds the payload
  FAILED = 1,      // executor raised; `error` says why ("invalid task: <field>: ..." when
                   // the payload was invalid: the client's mistake, see taskserver/abc.py)
  CANCELLED = 2,   // removed by cancel(query_id) before or while running
  REJECTED = 3,    // the server refused it or gave it up unfinished (draining, owned
                   // by another gateway, bad payload, queue full); `error` says why
  DROPPED = 4,     // dropped on purpose: it could not meet its deadline (PARD); `error` says where
}

struct Task {
  1: required string query_id,
  2: required i32 task_index,
  // Remaining pre-dequeuing budget: the server's local deadline is
  // receipt + deadline_budget_ms (TailGuard eq. (4), t_D, as a duration).
  3: required double deadline_budget_ms,
  // Remaining budget to t0 + SLO (the T-EDFQ key).
  4: required double slo_budget_ms,
  // Class priority for PRIQ: smaller is served first.
  5: required i32 priority,
  6: optional string class_name,
  // Opaque task payload (JSON for the built-in executors).
  7: optional binary payload,
  // W3C Trace Context of the gateway's span for this task, sent only when the
  // gateway traces (taskserver/tracing.py): a version-00 traceparent (55
  // characters) and the caller's tracestate (at most 512 characters). A server
  // that traces records the task's queue wait and service as child spans; it
  // ignores a value that is not valid, and a server that predates the fields
  // skips them.
  8: optional string traceparent,
  9: optional string tracestate,
}

struct TaskResult {
  1: required string query_id,
  2: required i32 task_index,
  3: required TaskStatus status,
  // Receipt -> dequeue on the server (the pre-dequeuing time spent there).
  4: required double queue_ms,
  // Dequeue -> executor done.
  5: required double service_ms,
  // Receipt -> result sent: lets the gateway split its round trip into
  // server time and network time without shared clocks.
  6: required double server_ms,
  // Dequeued after its local deadline.
  7: required bool missed_deadline,
  8: optional binary result,
  9: optional string error,
}

// One gateway's local request rate for the server's pool (Swayam 4.2's lambda_i, in tasks
// per second of the pool), sent with its heartbeat; listed back to every gateway, so each
// can sum them into the global rate lambda (taskserver/frontends.py).
struct FrontendLoad {
  1: required string gateway_id,
  2: required double rate_per_s,
}

struct ServerStatus {
  1: required string server_id,
  2: required string policy,
  3: required i32 slots,
  4: required i32 busy,
  5: required i32 queued,
  6: required i64 tasks_done,
  7: required i64 deadline_misses,
  8: required bool draining,
  9: optional string executor,
  // The gateway that owns this server's slots (central queueing), if a lease
  // is live, and how long that lease still runs.
  // Named only to a connection that has proved the registration token (a claim
  // with a valid proof), or by a server that has no token.
  10: optional string owner,
  11: optional double owner_lease_ms,
  // This connection's nonce: a claim on it signs it (OwnerClaim.proof).
  12: optional binary claim_nonce,
  // Why the claim sent with this call was refused; absent when it was granted
  // or none was sent. It never names the current owner.
  13: optional string claim_error,
  // The latest rate this server heard from each gateway (the caller's own included)
  // within its horizon; at most 64 entries. Absent when no gateway sent one.
  14: optional list<FrontendLoad> frontends,
}

// A gateway that keeps a central queue for this server claims its slots: one
// owner at a time, for lease_ms after each claim (renewed by every heartbeat).
// A server with a registration token grants only claims that prove it:
// proof = HMAC-SHA256(token, the connection's claim_nonce, gateway_id, lease_ms),
// see taskserver/ownership.py.
struct OwnerClaim {
  1: required string gateway_id,
  2: required double lease_ms,
  3: optional binary proof,
}

service TaskServer {
  oneway void submit(1: Task task),
  oneway void submit_batch(1: list<Task> tasks),
  // Removes queued tasks of the query and cancels running ones; each gets a
  // CANCELLED result.
  oneway void cancel(1: string query_id),
  // The gateway's heartbeat. With `claim`, it also claims or renews ownership;
  // the reply's `owner` says who holds it (a server that predates claims
  // ignores the argument and names no owner). submit, submit_batch and cancel
  // are oneway: sent as CALLs they are answered with a TApplicationException
  // and not carried out. With `load`, the gateway reports its local request rate
  // (a server that predates it ignores the argument and lists no frontends).
  ServerStatus status(1: optional OwnerClaim claim, 2: optional FrontendLoad load),
  string ping(1: string token),
  // A pipeline stage's module states (JSON: {"pipeline", "states": [...]}) for
  // the stage before it, which polls at most once per second (PARD state
  // exchange across processes). Empty when the server runs no pipeline.
  binary pipeline_state(),
}

// What the gateway receives back, on the connection that carried the task.
service TaskSink {
  oneway void result(1: TaskResult result),
  oneway void result_batch(1: list<TaskResult> results),
}
