/* _bind_address.so: keeps a process's TCP servers to one address, and optionally to its own
 * user's local connections.
 *
 * Why: TensorFlow's gRPC server (the `tensorflow` communication backend) binds every
 * interface ("[::]:port"), whatever address TF_CONFIG gives the task, and it runs graphs for
 * anyone who reaches it (TensorFlow's SECURITY.md: run it on trusted networks only). There is
 * no option to bind one address, nor to authenticate a client. `python -m crossover_tf.launch`
 * (and the experiments' launcher) preload this library into their tasks (LD_PRELOAD):
 *
 * CROSSOVER_BIND_ADDRESS=A (an IPv4 literal): a bind to the unspecified address (0.0.0.0, or
 *   [::] for a dual-stack socket) binds A instead (as ::ffff:A on an IPv6 socket, which IPv4
 *   clients reach), and a listen() on a socket never bound (which the kernel would bind to
 *   every interface) binds A first; a listen() on a socket bound to every interface behind
 *   this library's back fails (EADDRNOTAVAIL). Binds to a given address pass untouched.
 * CROSSOVER_ACCEPT_OWN_USER=1: accept() and accept4() hand over only TCP connections whose
 *   client socket is on this machine (this network namespace) and owned by this process's
 *   effective uid, looked up by its four-tuple through the kernel's socket diagnostics
 *   (NETLINK_SOCK_DIAG, what `ss` reads); any other connection, or one that cannot be looked
 *   up, is closed unread. It keeps other local users off a job whose ranks are all local
 *   (127.0.0.1 is every local user's). Not for jobs across hosts: their peers are not local.
 *
 * Every other call passes through untouched; without the variables nothing is changed.
 * Plain C, no TensorFlow: built beside the op library by ops/Makefile and Bazel.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

typedef int (*bind_fn)(int, const struct sockaddr*, socklen_t);
typedef int (*listen_fn)(int, int);
typedef int (*accept4_fn)(int, struct sockaddr*, socklen_t*, int);

static bind_fn real_bind;
static listen_fn real_listen;
static accept4_fn real_accept4;
static struct in_addr target;
static int have_target;
static int own_user_only;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
  real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  real_listen = (listen_fn)dlsym(RTLD_NEXT, "listen");
  real_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
  const char* value = getenv("CROSSOVER_BIND_ADDRESS");
  have_target = value != NULL && inet_pton(AF_INET, value, &target) == 1;
  const char* own = getenv("CROSSOVER_ACCEPT_OWN_USER");
  own_user_only = own != NULL && strcmp(own, "1") == 0;
}

/* ----- bind and listen: one address ------------------------------------------------------ */

static void map_target(struct in6_addr* out) {  /* ::ffff:A, the IPv4-mapped address */
  memset(out, 0, sizeof *out);
  out->s6_addr[10] = 0xff;
  out->s6_addr[11] = 0xff;
  memcpy(&out->s6_addr[12], &target, sizeof target);
}

static int bind_ipv4(int fd, const struct sockaddr* addr, socklen_t len) {
  struct sockaddr_in in4;
  memcpy(&in4, addr, sizeof in4);
  if (in4.sin_addr.s_addr != htonl(INADDR_ANY)) return real_bind(fd, addr, len);
  in4.sin_addr = target;
  return real_bind(fd, (const struct sockaddr*)&in4, sizeof in4);
}

static int bind_ipv6(int fd, const struct sockaddr* addr, socklen_t len) {
  struct sockaddr_in6 in6;
  memcpy(&in6, addr, sizeof in6);
  if (!IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) return real_bind(fd, addr, len);
  map_target(&in6.sin6_addr);
  return real_bind(fd, (const struct sockaddr*)&in6, sizeof in6);
}

static int guarded_bind(int fd, const struct sockaddr* addr, socklen_t len) {
  if (!have_target || addr == NULL) return real_bind(fd, addr, len);
  if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    return bind_ipv4(fd, addr, len);
  }
  if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    return bind_ipv6(fd, addr, len);
  }
  return real_bind(fd, addr, len);
}

int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  pthread_once(&once, init);
  if (real_bind == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return guarded_bind(fd, addr, len);
}

/* 1: an IPv4 or IPv6 stream socket bound to every interface (port 0: never bound), *port its
 * port; 0: anything else (bound to one address, another family or type, not a socket). */
static int on_every_interface(int fd, in_port_t* port) {
  struct sockaddr_storage local;
  socklen_t len = sizeof local;
  int type = 0;
  socklen_t type_len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM) {
    return 0;
  }
  if (getsockname(fd, (struct sockaddr*)&local, &len) != 0) return 0;
  if (local.ss_family == AF_INET) {
    const struct sockaddr_in* in4 = (const struct sockaddr_in*)&local;
    *port = in4->sin_port;
    return in4->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (local.ss_family == AF_INET6) {
    const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)&local;
    *port = in6->sin6_port;
    return IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
  }
  return 0;
}

/* A socket that listens unbound would be bound by the kernel to every interface: bind it to
 * the address first (a wildcard bind, which guarded_bind turns into the address). */
static int bind_before_listen(int fd) {
  in_port_t port = 0;
  if (!on_every_interface(fd, &port)) return 0;
  if (port != 0) {  /* bound to every interface behind bind()'s back: refuse to listen */
    errno = EADDRNOTAVAIL;
    return -1;
  }
  struct sockaddr_storage any;
  socklen_t len = sizeof any;
  if (getsockname(fd, (struct sockaddr*)&any, &len) != 0) return -1;
  return guarded_bind(fd, (const struct sockaddr*)&any, len);
}

int listen(int fd, int backlog) {
  pthread_once(&once, init);
  if (real_listen == NULL || real_bind == NULL) {
    errno = ENOSYS;
    return -1;
  }
  if (have_target && bind_before_listen(fd) != 0) return -1;
  return real_listen(fd, backlog);
}

/* ----- accept: this machine's connections of this user ----------------------------------- */

struct diag_request {
  struct nlmsghdr header;
  struct inet_diag_req_v2 body;
};

/* The four-tuple of the client's socket (its source is our peer, its destination us), in the
 * form the request wants: 1 done, -1 fd is no IPv4 or IPv6 connection (a Unix socket's, which
 * this fence leaves alone), 0 it cannot be told. */
static int client_tuple(int fd, struct inet_diag_req_v2* req) {
  struct sockaddr_storage peer, local;
  socklen_t peer_len = sizeof peer, local_len = sizeof local;
  if (getsockname(fd, (struct sockaddr*)&local, &local_len) != 0) return 0;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return -1;
  if (getpeername(fd, (struct sockaddr*)&peer, &peer_len) != 0 ||
      peer.ss_family != local.ss_family) {
    return 0;
  }
  req->sdiag_family = peer.ss_family;
  req->sdiag_protocol = IPPROTO_TCP;
  req->idiag_states = ~0U;
  req->id.idiag_cookie[0] = req->id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (peer.ss_family == AF_INET) {
    req->id.idiag_sport = ((struct sockaddr_in*)&peer)->sin_port;
    req->id.idiag_dport = ((struct sockaddr_in*)&local)->sin_port;
    memcpy(req->id.idiag_src, &((struct sockaddr_in*)&peer)->sin_addr, 4);
    memcpy(req->id.idiag_dst, &((struct sockaddr_in*)&local)->sin_addr, 4);
    return 1;
  }
  if (peer.ss_family == AF_INET6) {
    req->id.idiag_sport = ((struct sockaddr_in6*)&peer)->sin6_port;
    req->id.idiag_dport = ((struct sockaddr_in6*)&local)->sin6_port;
    req->id.idiag_if = ((struct sockaddr_in6*)&peer)->sin6_scope_id;
    memcpy(req->id.idiag_src, &((struct sockaddr_in6*)&peer)->sin6_addr, 16);
    memcpy(req->id.idiag_dst, &((struct sockaddr_in6*)&local)->sin6_addr, 16);
    return 1;
  }
  return 0;
}

/* A connected client socket's state (the kernel's lookup falls back to a listener, and
 * reports uid 0 for time-wait and request sockets: none of them is a client). */
static int client_state(unsigned char state) {
  return state == TCP_ESTABLISHED || state == TCP_FIN_WAIT1 || state == TCP_FIN_WAIT2 ||
         state == TCP_CLOSE_WAIT || state == TCP_LAST_ACK || state == TCP_CLOSING;
}

/* Once per process, on stderr: a kernel without socket diagnostics refuses every connection,
 * the job's own included, and its ranks would only time out. */
static void warn_unanswered(void) {
  static int warned;
  if (__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) return;
  static const char text[] =
      "crossover_tf bind guard: the kernel's socket diagnostics (NETLINK_SOCK_DIAG) did not "
      "answer, so no connection's owner can be told and every connection is refused "
      "(CROSSOVER_ACCEPT_OWN_USER=1); crossover_tf.launch --listen_on_all_interfaces turns "
      "the guard off on a trusted network\n";
  ssize_t ignored = write(STDERR_FILENO, text, sizeof text - 1);
  (void)ignored;
}

/* 1 when the kernel names a connected client socket at exactly this four-tuple, owned by our
 * effective uid; 0 otherwise (not found, another owner, any error). */
static int ask_kernel(const struct diag_request* request) {
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) {
    warn_unanswered();
    return 0;
  }
  /* Bounded: this runs inside accept(), on the server's poller thread; a kernel that never
   * answers (it does not happen, but nothing else bounds it) refuses the one connection. */
  const struct timeval bound = {1, 0};
  (void)setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  long reply[1024];  /* aligned for struct nlmsghdr */
  ssize_t got = -1;
  if (send(nl, request, sizeof *request, 0) == (ssize_t)sizeof *request) {
    do got = recv(nl, reply, sizeof reply, 0);
    while (got < 0 && errno == EINTR);
  }
  close(nl);
  const struct nlmsghdr* header = (const struct nlmsghdr*)reply;
  if (got < (ssize_t)NLMSG_LENGTH(sizeof(int)) || !NLMSG_OK(header, got)) {
    warn_unanswered();
    return 0;
  }
  if (header->nlmsg_type == NLMSG_ERROR) {  /* ENOENT: no such socket here, a remote peer */
    const struct nlmsgerr* error = NLMSG_DATA(header);
    if (error->error != -ENOENT) warn_unanswered();
    return 0;
  }
  if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      got < (ssize_t)NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
    return 0;
  }
  const struct inet_diag_msg* found = NLMSG_DATA(header);
  return client_state(found->idiag_state) && found->idiag_uid == geteuid() &&
         found->id.idiag_sport == request->body.id.idiag_sport &&
         found->id.idiag_dport == request->body.id.idiag_dport;
}

static int own_user_connection(int fd) {
  struct diag_request request;
  memset(&request, 0, sizeof request);
  request.header.nlmsg_len = sizeof request;
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST;
  int tuple = client_tuple(fd, &request.body);
  return tuple < 0 || (tuple > 0 && ask_kernel(&request));
}

/* Accepts until a connection passes (closing the others unread), or the real call fails
 * (EAGAIN on a non-blocking socket once the queue holds no more). */
int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  pthread_once(&once, init);
  if (real_accept4 == NULL) {
    errno = ENOSYS;
    return -1;
  }
  for (;;) {
    socklen_t given = len != NULL ? *len : 0;
    int conn = real_accept4(fd, addr, len, flags);
    if (conn < 0 || !own_user_only) return conn;
    if (own_user_connection(conn)) return conn;
    close(conn);
    if (len != NULL) *len = given;
  }
}

int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  return accept4(fd, addr, len, 0);
}
