// The lease directory's file system allowlist and trust rule (see lease_dir.h).
#include "core/lease_dir.h"

#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/lease_internal.h"

namespace crossover {
namespace {

struct FileSystemType {
  uint32_t magic;
  const char* name;
  bool local;
};

// statfs f_type values (linux/magic.h). The non-local ones are listed only to name them in the
// refusal; crossover_tf/lease/segments.py keeps the same allowlist.
constexpr FileSystemType kFileSystems[] = {
    {0x01021994, "tmpfs", true},     {0x858458F6, "ramfs", true},
    {0xEF53, "ext2/ext3/ext4", true}, {0x58465342, "xfs", true},
    {0x9123683E, "btrfs", true},     {0x2FC12FC1, "zfs", true},
    {0xF2F52010, "f2fs", true},      {0x794C7630, "overlayfs", true},
    {0x6969, "nfs", false},          {0x517B, "smb", false},
    {0xFF534D42, "cifs", false},     {0xFE534D42, "smb2", false},
    {0x01021997, "9p", false},       {0x00C36400, "ceph", false},
    {0x65735546, "fuse", false},     {0x5346414F, "afs", false},
    {0x73757245, "coda", false},     {0x0BD00BD0, "lustre", false},
    {0x47504653, "gpfs", false},     {0x01161970, "gfs2", false},
    {0x7461636F, "ocfs2", false},    {0x19830326, "beegfs", false},
    {0x20030528, "panfs", false},    {0x7B7B7B7B, "fhgfs/beegfs", false},
};

LeaseStatus Denied(const std::string& message) {
  return LeaseStatus::Error(LeaseCode::kPermissionDenied, message);
}

std::string UserText(uid_t uid) {
  std::vector<char> buf(16384);
  struct passwd pw, *found = nullptr;
  std::string text = "uid " + std::to_string(uid);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) {
    text += " (" + std::string(pw.pw_name) + ")";
  }
  return text;
}

// Whether this process may write as a member of gid (its effective or a supplementary group).
bool ProcessInGroup(gid_t gid) {
  if (getegid() == gid) return true;
  const int n = getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(n);
  const int got = getgroups(n, groups.data());
  for (int i = 0; i < got; ++i) {
    if (groups[i] == gid) return true;
  }
  return false;
}


// Whether uid is a member of gid (its primary group, or listed among gid's members), by the
// user database; kUnknown when the database does not know uid.
enum class Membership { kMember, kNotMember, kUnknown };

Membership MembershipOf(uid_t uid, gid_t gid) {
  std::vector<char> buf(16384);
  struct passwd pw, *found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return Membership::kUnknown;
  }
  if (pw.pw_gid == gid) return Membership::kMember;
  const std::string name = pw.pw_name;
  std::vector<char> gbuf(1 << 16);
  struct group gr, *group = nullptr;
  if (getgrgid_r(gid, &gr, gbuf.data(), gbuf.size(), &group) != 0 || group == nullptr) {
    return Membership::kNotMember;
  }
  for (char** member = gr.gr_mem; member && *member; ++member) {
    if (name == *member) return Membership::kMember;
  }
  return Membership::kNotMember;
}

// uid is a member of gid, or the user database does not know uid (a job started with a bare
// uid, e.g. by setpriv or a container runtime): its membership cannot be told here, and the
// directory rule already kept users outside the group from writing in the directory.
bool MaybeInGroup(uid_t uid, gid_t gid) {
  return MembershipOf(uid, gid) != Membership::kNotMember;
}

// Why an ancestor, or a private-mode lease directory, is not safe; "" if it is.
std::string PrivateProblem(const std::string& path, const struct stat& st, uid_t me) {
  if (st.st_uid != 0 && st.st_uid != me) {
    return DescribeFile(path, st) + " is owned by neither root nor this job's user (" +
           UserText(me) + "), so its owner could rename or replace the lease segment";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    return DescribeFile(path, st) + " is writable by its group or by others and is not sticky, "
           "so they could rename or replace the lease segment";
  }
  return "";
}

// Why a group-mode lease directory is not safe; "" if it is. member: this process must be able
// to write as a member of the directory's group.
std::string GroupProblem(const std::string& path, const struct stat& st, uid_t me,
                         bool member) {
  if (st.st_uid != 0 && st.st_uid != me && !MaybeInGroup(st.st_uid, st.st_gid)) {
    return DescribeFile(path, st) + " is owned by a user who is neither root, this job's user (" +
           UserText(me) + ") nor a member of its group";
  }
  if (st.st_mode & S_IWOTH) {
    return DescribeFile(path, st) + " is writable by others: in group mode a user outside the "
           "lease group could plant a segment there, sticky or not";
  }
  if (!(st.st_mode & S_IWGRP)) {
    return DescribeFile(path, st) + " is not writable by its group, so the group's jobs cannot all "
           "create their lease there";
  }
  if (!(st.st_mode & S_ISVTX)) {
    return DescribeFile(path, st) + " is not sticky: in group mode any member could rename or "
           "remove another member's live segment, and the next job would start a second lease "
           "(two holders at once)";
  }
  if (member && me != 0 && !ProcessInGroup(st.st_gid)) {
    return DescribeFile(path, st) + ": in group mode (shared_group) every job's user must be a "
           "member of the group of the lease directory " + path + " (gid " +
           std::to_string(st.st_gid) + "), and this process (" + UserText(me) + ") is not";
  }
  return "";
}

LeaseStatus Refuse(const std::string& dir, const std::string& problem, DirUse use) {
  std::string fix;
  if (use == DirUse::kGroup) {
    fix = "make it the group's, writable by the group and nobody else, and sticky, under a "
          "parent only root can write (in /tmp or /var/tmp another user could plant a link at "
          "the name first, and root's install would follow it): as root, `install -d -m 3770 "
          "-g GROUP " + dir + "`, or a systemd-tmpfiles line `d " + dir + " 3770 root GROUP -`, "
          "which refuses a link on the path";
  } else {
    fix = "create it so that no other user can change its entries: as root, under a parent "
          "only root can write, `install -d -m 1777 " + dir + "` (sticky, like /dev/shm: every "
          "user's segments stay their own), or as this job's user, `install -d -m 0700 " + dir +
          "`; several users who share a lease use group mode in a directory made with "
          "`install -d -m 3770 -g GROUP " + dir + "`";
  }
  return Denied(
      "crossover lease directory " + dir + " fails the lease's trust rule: " + problem +
          ". A user who can change the directory's entries could let two jobs hold the device "
          "at once or fake the group's join check (docs/deploying.md, \"Who may write the "
          "lease directory\"). Fix: " + fix + "; every directory above it must be root's or "
          "yours and not writable by others unless sticky (`chmod go-w` or `chmod +t`)");
}

}  // namespace

const char* LocalFileSystem(int64_t f_type) {
  for (const FileSystemType& fs : kFileSystems) {
    if (fs.magic == static_cast<uint32_t>(f_type)) return fs.local ? fs.name : nullptr;
  }
  return nullptr;
}

std::string FileSystemText(int64_t f_type) {
  char magic[16];
  snprintf(magic, sizeof(magic), "0x%x", static_cast<uint32_t>(f_type));
  for (const FileSystemType& fs : kFileSystems) {
    if (fs.magic == static_cast<uint32_t>(f_type)) return std::string(fs.name) + " (" + magic + ")";
  }
  return std::string("an unknown type (") + magic + ")";
}

std::string DescribeFile(const std::string& path, const struct stat& st) {
  return path + " (owner " + UserText(st.st_uid) + ", group " + std::to_string(st.st_gid) +
         ", mode " + ModeText(st.st_mode) + ")";
}

std::string ModeText(mode_t mode) {
  char text[16];
  snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}


bool UidInGroup(uid_t uid, gid_t gid) { return MembershipOf(uid, gid) == Membership::kMember; }

TrustedDir::TrustedDir(int fd, std::string path, const struct stat& st, bool group_mode)
    : fd_(fd), path_(std::move(path)), st_(st), group_mode_(group_mode) {}

TrustedDir::~TrustedDir() {
  if (fd_ >= 0) close(fd_);
}

namespace {

constexpr int kMaxLinks = 40;  // as the kernel's ELOOP bound

// Whether a directory's mode is group mode's: writable by its group, not by others, sticky
// (checked before GroupProblem, whose owner check may ask the user database, on every read).
bool GroupModeBits(const struct stat& st) {
  return (st.st_mode & (S_IWGRP | S_IWOTH | S_ISVTX)) == (S_IWGRP | S_ISVTX);
}

// Why a directory on the lease path is not safe ("" if it is): the rule for an ancestor, or
// for the lease directory itself (leaf), for this use; *is_group: it passed as a group-mode one.
std::string DirProblem(const std::string& path, const struct stat& st, DirUse use, bool leaf,
                       uid_t me, bool* is_group) {
  *is_group = false;
  if (use == DirUse::kObserve) {
    // An observer (status, the exporter) only reads, and reads every user's leases: it
    // trusts a directory's owner, whoever that is, as long as nobody else can change its
    // entries. A lease directory that passes as a group-mode one (the group's 3770) is read
    // as one even though it passes the private rule too (root's and sticky): else its
    // group's 0660 segments would all be refused and no group-mode lease ever observed.
    const uid_t trusted = (st.st_uid == 0 || st.st_uid == me) ? me : st.st_uid;
    const std::string problem = PrivateProblem(path, st, trusted);
    if (!leaf || (problem.empty() && !GroupModeBits(st))) return problem;
    const std::string group = GroupProblem(path, st, me, /*member=*/false);
    *is_group = group.empty();
    if (problem.empty() || *is_group) return "";
    return problem + "; nor does it pass as a group-mode directory: " + group;
  }
  if (!leaf || use == DirUse::kPrivate) return PrivateProblem(path, st, me);
  *is_group = true;
  return GroupProblem(path, st, me, /*member=*/true);
}

// Why the link at path, found in a directory whose fstat is parent, may not be followed; "" if
// it may: its owner is root or this job's user (an observer: also the directory's owner).
// Its directory passed the rule, so nobody else can replace the link itself.
std::string LinkProblem(const std::string& path, const struct stat& link,
                        const struct stat& parent, DirUse use, uid_t me) {
  if (link.st_uid == 0 || link.st_uid == me) return "";
  if (use == DirUse::kObserve && link.st_uid == parent.st_uid) return "";
  return path + " is a symbolic link owned by " + UserText(link.st_uid) + ", who is neither "
         "root nor this job's user (" + UserText(me) + "): its owner could point it at "
         "another directory between two jobs' opens, and the group's jobs would hold two "
         "leases (two holders at once). Name the directory itself, not the link";
}

std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= path.size()) {
    const size_t end = std::min(path.find('/', begin), path.size());
    if (end > begin) parts.push_back(path.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// One directory of the walk: held open, with its fstat and resolved path.
struct Step {
  int fd;
  std::string path;
  struct stat st;
  bool checked;  // as an ancestor
};

std::string Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

}  // namespace

LeaseStatus OpenTrustedDir(const std::string& dir_in, DirUse use,
                           std::shared_ptr<const TrustedDir>* out) {
  const uid_t me = geteuid();
  std::string dir = dir_in;
  if (dir.empty() || dir[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) return Internal("getcwd");
    dir = Join(cwd, dir);
  }
  std::vector<Step> stack;
  auto close_all = [&stack] {
    for (const Step& step : stack) close(step.fd);
    stack.clear();
  };
  auto fail = [&close_all](LeaseStatus status) {
    close_all();
    return status;
  };
  auto open_root = [&]() -> LeaseStatus {
    close_all();
    const int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Internal("open /");
    stack.push_back(Step{fd, "/", {}, false});
    if (fstat(fd, &stack.back().st) != 0) return Internal("fstat /");
    return LeaseStatus::Ok();
  };
  auto missing = [&dir](const std::string& path) {
    return LeaseStatus::Error(
        LeaseCode::kInvalidArgument,
        Errno("crossover lease directory " + dir + " cannot be used (" + path + ")") +
            " (it must exist and be the same directory for every job of the group on this "
            "host)");
  };
  LeaseStatus status = open_root();
  if (!status.ok()) return fail(status);
  std::vector<std::string> todo = Components(dir);
  std::reverse(todo.begin(), todo.end());  // a stack: the next component last
  int links = 0;
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    if (name == ".") continue;
    if (name == "..") {
      if (stack.size() > 1) {
        close(stack.back().fd);
        stack.pop_back();
      }
      continue;
    }
    Step& cur = stack.back();
    bool is_group = false;
    if (!cur.checked) {  // about to trust its entries: it is an ancestor
      const std::string problem = DirProblem(cur.path, cur.st, use, /*leaf=*/false, me, &is_group);
      if (!problem.empty()) return fail(Refuse(dir, problem, use));
      cur.checked = true;
    }
    const std::string path = Join(cur.path, name);
    struct stat st;
    if (fstatat(cur.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return fail(missing(path));
    if (S_ISLNK(st.st_mode)) {
      const std::string problem = LinkProblem(path, st, cur.st, use, me);
      if (!problem.empty()) return fail(Refuse(dir, problem, use));
      if (++links > kMaxLinks) {
        errno = ELOOP;
        return fail(missing(path));
      }
      char target[PATH_MAX];
      const ssize_t n = readlinkat(cur.fd, name.c_str(), target, sizeof(target) - 1);
      if (n < 0) return fail(missing(path));
      target[n] = '\0';
      std::vector<std::string> parts = Components(target);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_back(*it);
      if (target[0] == '/') {
        status = open_root();
        if (!status.ok()) return fail(status);
      }
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      return fail(LeaseStatus::Error(LeaseCode::kInvalidArgument,
                                     "crossover lease directory " + dir + " is not a directory (" +
                                         path + " is not one)"));
    }
    const int fd = openat(cur.fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat opened;
    if (fd < 0 || fstat(fd, &opened) != 0 || opened.st_ino != st.st_ino ||
        opened.st_dev != st.st_dev) {
      if (fd >= 0) close(fd);
      return fail(Denied("crossover lease directory " + dir + ": " + path +
                         " was replaced while it was checked (by a link?)"));
    }
    stack.push_back(Step{fd, path, opened, false});
  }
  Step leaf = stack.back();
  stack.pop_back();
  close_all();
  bool is_group = false;
  const std::string problem = DirProblem(leaf.path, leaf.st, use, /*leaf=*/true, me, &is_group);
  if (!problem.empty()) {
    close(leaf.fd);
    return Refuse(dir, problem, use);
  }
  *out = std::make_shared<const TrustedDir>(leaf.fd, leaf.path, leaf.st, is_group);
  return LeaseStatus::Ok();
}

LeaseStatus CheckSegmentTrust(const std::string& path, const struct stat& st, gid_t dir_gid,
                              bool group_mode, bool observer) {
  if (!S_ISREG(st.st_mode)) {
    return Denied(path + " is not a regular file");
  }
  const uid_t me = geteuid();
  const mode_t bits = st.st_mode & 07777;
  // An observer in a group-mode directory reads private-mode jobs' 0600 segments too: a job
  // without shared_group may use a sticky group directory its user may write.
  if (group_mode && !(observer && (bits & 077) == 0)) {
    if (st.st_gid != dir_gid) {
      return Denied(
          path + " belongs to group " + std::to_string(st.st_gid) + ", not to the group of "
              "its lease directory (gid " + std::to_string(dir_gid) + "): in group mode a "
              "lease segment must belong to the lease directory's group. Another group's jobs "
              "use this name, or the file is stale: use another lease directory or group name, "
              "or remove the file if no job uses it");
    }
    if (bits != 0660) {
      return Denied(
          path + " has permissions " + ModeText(bits) + "; in group mode a lease segment must "
              "be 0660 (its owner and the directory's group, nobody else). Remove the file (no "
              "job should be using it) and start again");
    }
    if (st.st_uid != 0 && st.st_uid != me && !MaybeInGroup(st.st_uid, dir_gid)) {
      return Denied(
          path + " belongs to " + UserText(st.st_uid) + ", who is not a member of the lease "
              "directory's group (gid " + std::to_string(dir_gid) + "): a user outside the "
              "group planted it. Remove it, and make the directory writable by the group only "
              "(chmod 3770)");
    }
    return LeaseStatus::Ok();
  }
  if (!observer && st.st_uid != me) {
    return Denied(
        path + " belongs to " + UserText(st.st_uid) + ", not to this process (uid " +
            std::to_string(me) + "): another user uses this group name; pick another group, "
            "or remove the file if it is stale");
  }
  if (bits & 077) {  // 0600, or stricter under a strict umask
    return Denied(
        path + " has permissions " + ModeText(bits) + "; a lease segment must be private to "
            "its owner (0600), unless jobs of several users share it in group mode "
            "(shared_group). Remove the file (no job should be using it) and start again");
  }
  return LeaseStatus::Ok();
}

}  // namespace crossover
