/* _bind_address.so: makes a process's listening sockets bind one address instead of all.
 *
 * Why: TensorFlow's gRPC server (the `tensorflow` communication backend) binds every
 * interface ("[::]:port"), whatever address TF_CONFIG gives the task, and it runs graphs for
 * anyone who reaches it (TensorFlow's SECURITY.md: run it on trusted networks only). There is
 * no option to bind one address. `python -m crossover_tf.launch` preloads this library into its
 * tasks (LD_PRELOAD) with CROSSOVER_BIND_ADDRESS set to the tasks' address, so a bind to the
 * unspecified address (0.0.0.0, or [::] for a dual-stack socket) binds that address instead
 * (as ::ffff:A on an IPv6 socket, which IPv4 clients reach). Binds to a given address, and
 * every other call, are passed through untouched; without CROSSOVER_BIND_ADDRESS (or with a
 * value that is not an IPv4 literal) nothing is changed.
 *
 * Plain C, no TensorFlow: built beside the op library by ops/Makefile and Bazel.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr*, socklen_t);

static bind_fn real_bind;
static struct in_addr target;
static int have_target;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
  real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  const char* value = getenv("CROSSOVER_BIND_ADDRESS");
  have_target = value != NULL && inet_pton(AF_INET, value, &target) == 1;
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
  memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);  /* ::ffff:A, the IPv4-mapped address */
  in6.sin6_addr.s6_addr[10] = 0xff;
  in6.sin6_addr.s6_addr[11] = 0xff;
  memcpy(&in6.sin6_addr.s6_addr[12], &target, sizeof target);
  return real_bind(fd, (const struct sockaddr*)&in6, sizeof in6);
}

int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  pthread_once(&once, init);
  if (real_bind == NULL) {
    errno = ENOSYS;
    return -1;
  }
  if (!have_target || addr == NULL) return real_bind(fd, addr, len);
  if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    return bind_ipv4(fd, addr, len);
  }
  if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    return bind_ipv6(fd, addr, len);
  }
  return real_bind(fd, addr, len);
}
