import Glibc

/// What a program checks of a file that can make it run commands (`--config`) or that holds a secret (`--NAME-file`)
/// before it reads it, as sshd's StrictModes does: no one but its owner (root or the user running the program) may
/// change it, nor replace it through a directory others can write; and a secret is not for every user's eyes.
public enum FileTrust {
    /// Why `path` cannot be trusted, or nil. `secret`: also refused when every user may read it. `what` names it in the
    /// message (`--config /etc/upload-relay/relay.json`).
    public static func problem(_ path: String, what: String, secret: Bool) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }  // the caller's read says why it cannot be read
        let mode = info.st_mode & 0o7777
        let octal = "0" + String(mode, radix: 8)
        let me = geteuid()
        if info.st_uid != 0 && info.st_uid != me {
            return
                "\(what) belongs to user \(info.st_uid), neither root nor the user running this (\(me)): whoever owns it decides what runs here; chown it"
        }
        if mode & 0o022 != 0 {
            return "\(what) can be changed by users other than its owner (mode \(octal)); chmod go-w \(path)"
        }
        if secret && mode & 0o004 != 0 {
            return "\(what) holds a secret that every user can read (mode \(octal)); chmod o-r \(path) (0600, or 0640 with the service's group)"
        }
        // Each directory above the file it names (links resolved): one that another user owns, or that others may
        // write, lets them put another file in its place (a sticky one, such as /tmp, only lets owners rename theirs).
        var directory = Self.parent(of: Self.resolved(path))
        while true {
            var above = stat()
            if stat(directory, &above) == 0 {
                let mode = above.st_mode & 0o7777
                let octal = "0" + String(mode, radix: 8)
                if above.st_uid != 0 && above.st_uid != me {
                    return "\(what) is in \(directory), which belongs to user \(above.st_uid) (neither root nor \(me)): its owner can replace it"
                }
                if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                    return
                        "\(what) is in \(directory), which users other than its owner can write (mode \(octal)): they can replace it; chmod go-w \(directory)"
                }
            }
            if directory == "/" { return nil }
            directory = Self.parent(of: directory)
        }
    }

    /// The path with every link resolved; the path as given when it cannot be (the file vanished since its stat).
    private static func resolved(_ path: String) -> String {
        guard let real = realpath(path, nil) else { return path }
        defer { free(real) }
        return String(cString: real)
    }

    private static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "/" }
        let parent = String(path[..<slash])
        return parent.isEmpty ? "/" : parent
    }
}
