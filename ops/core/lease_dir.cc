// The lease directory's file system allowlist and trust rule (see lease_dir.h).
#include "core/lease_dir.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdio>
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
    fix = "make it the group's, writable by the group and nobody else, and sticky: as root, "
          "`install -d -m 3770 -g GROUP " + dir + "` (or `chgrp GROUP " + dir + " && chmod 3770 " +
          dir + "`)";
  } else {
    fix = "create it so that no other user can change its entries: as root, `install -d -m "
          "1777 " + dir + "` (sticky, like /dev/shm: every user's segments stay their own), "
          "or as this job's user, `install -d -m 0700 " + dir + "`; several users who share a "
          "lease use group mode in a directory made with `install -d -m 3770 -g GROUP " + dir +
          "`";
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

LeaseStatus CheckDirTrust(const std::string& dir, DirUse use, bool* group_mode) {
  const uid_t me = geteuid();
  std::vector<std::string> paths{"/"};
  for (size_t end = 1; end <= dir.size(); ++end) {
    if ((end == dir.size() || dir[end] == '/') && dir[end - 1] != '/') {
      paths.push_back(dir.substr(0, end));
    }
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) {
      return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                                Errno("crossover lease directory " + dir + ": cannot check " +
                                      path));
    }
    if (!S_ISDIR(st.st_mode)) {
      return Denied("crossover lease directory " + dir + ": " + path +
                    " is no longer a directory (replaced by a link?)");
    }
    const bool leaf = i + 1 == paths.size();
    std::string problem;
    bool is_group = false;
    if (use == DirUse::kObserve) {
      // An observer (status, the exporter) only reads, and reads every user's leases: it
      // trusts a directory's owner, whoever that is, as long as nobody else can change its
      // entries; a lease directory may also be a group-mode one.
      const uid_t trusted = (st.st_uid == 0 || st.st_uid == me) ? me : st.st_uid;
      problem = PrivateProblem(path, st, trusted);
      if (!problem.empty() && leaf) {
        const std::string group = GroupProblem(path, st, me, /*member=*/false);
        if (group.empty()) {
          problem = "";
          is_group = true;
        } else {
          problem += "; nor does it pass as a group-mode directory: " + group;
        }
      }
    } else if (!leaf || use == DirUse::kPrivate) {
      problem = PrivateProblem(path, st, me);
    } else {
      problem = GroupProblem(path, st, me, /*member=*/true);
      is_group = true;
    }
    if (!problem.empty()) return Refuse(dir, problem, use);
    if (leaf && group_mode) *group_mode = is_group;
  }
  return LeaseStatus::Ok();
}

LeaseStatus CheckSegmentTrust(const std::string& path, const struct stat& st, gid_t dir_gid,
                              bool group_mode, bool observer) {
  if (!S_ISREG(st.st_mode)) {
    return Denied(path + " is not a regular file");
  }
  const uid_t me = geteuid();
  const mode_t bits = st.st_mode & 07777;
  if (group_mode) {
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
