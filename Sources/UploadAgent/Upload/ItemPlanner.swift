#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials
import UploadProtocol

/// Turns what the user named on the command line into upload items with keys, and a result for every path that will
/// not be uploaded (nothing is left out without a word).
///
/// A file's key is its base name; a directory is walked recursively and each file's key is its path relative to the
/// directory's parent (`send dir` stores `dir/a/b.jpg`); `-` is stdin and needs `name`. `prefix` goes in front of every
/// key. Files are opened by their absolute paths (a queue handed to another process names exactly these files).
///
/// One policy for every path, named or found in a walk (`DirectoryWalker`): a symbolic link is skipped, and said so,
/// unless `followSymlinks`; so are what is not a regular file or a directory, a directory that cannot be read, and a
/// name that is not UTF-8 (keys are UTF-8). A file whose name cannot make a key (a backslash, a control character) fails
/// alone: the rest go up.
public enum ItemPlanner {
    /// A command line that cannot be carried out at all (a usage error): stdin without a key, a prefix no key may have.
    public struct PlanError: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// What to upload, and what will not be, each with its result already.
    public struct Plan: Sendable {
        public var items: [UploadItem]
        /// Paths skipped (``UploadResult/Status/skipped``) or failed before a byte was read (a name no key may have, a
        /// path that does not exist, two paths for one key), in the order met.
        public var results: [UploadResult]
        /// The bytes of the files planned, as the walk saw them; nil when an item is a stream (its length is unknown).
        public var fileBytes: UInt64? = 0
        /// The size of each item as the walk saw it, in the order of ``items``; nil for a stream.
        public var sizes: [UInt64?] = []
    }

    /// The key of a file at `relative` (from a watched directory's parent) under `prefix`, or why it cannot be one.
    public static func key(relative: String, prefix: String?, limits: ProtocolLimits = ProtocolLimits()) throws -> String {
        let full = Self.prefixed(relative, Self.cleanPrefix(prefix))
        do {
            _ = try ObjectKey(validating: full, maxLength: limits.maxKeyLength, maxSegmentLength: limits.maxKeySegmentLength)
        } catch {
            throw PlanError(description: "key \"\(full)\" is not allowed: \(error.reason) (rename the file, or change --prefix)")
        }
        return full
    }

    static func cleanPrefix(_ prefix: String?) -> String? {
        prefix.map { $0.split(separator: "/").joined(separator: "/") }.flatMap { $0.isEmpty ? nil : $0 }
    }

    static func prefixed(_ key: String, _ prefix: String?) -> String {
        prefix.map { $0 + "/" + key } ?? key
    }

    /// `path` made absolute against the working directory, as written (no link resolved, no `..` taken away).
    public static func absolute(_ path: String) -> String {
        guard !path.hasPrefix("/") else { return path }
        var base = FileManager.default.currentDirectoryPath
        if base.hasSuffix("/") { base.removeLast() }
        var rest = Substring(path)
        while rest.hasPrefix("./") { rest = rest.dropFirst(2).drop { $0 == "/" } }
        if rest.isEmpty || rest == "." { return base.isEmpty ? "/" : base }
        return base + "/" + rest
    }

    /// The last name of `path` (of the directory it names, for `.` or `..`).
    static func name(_ path: String) -> String {
        URL(fileURLWithPath: path).standardizedFileURL.lastPathComponent
    }

    /// The command-line arguments that were not UTF-8, as the program received them (each invalid byte a U+FFFD): no
    /// path of that name can be opened, and it is not missing either.
    public static func argumentsNotUTF8() -> Set<String> {
        var found = Set<String>()
        for index in 1..<Int(CommandLine.argc) {
            guard let argument = CommandLine.unsafeArgv[index] else { continue }
            let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(argument).assumingMemoryBound(to: UInt8.self), count: strlen(argument))
            if String(validating: bytes, as: UTF8.self) == nil { found.insert(String(decoding: bytes, as: UTF8.self)) }
        }
        return found
    }

    /// `notUTF8`: paths named that were not UTF-8 (``argumentsNotUTF8()``): skipped, and said why.
    public static func plan(
        paths: [String], prefix: String?, stdinName: String?, limits: ProtocolLimits = ProtocolLimits(), followSymlinks: Bool = false,
        notUTF8: Set<String> = []
    ) throws -> Plan {
        let cleanPrefix = Self.cleanPrefix(prefix)
        if let cleanPrefix {
            // A prefix no key may start with makes every key invalid: the command line is wrong, not the files.
            do {
                _ = try ObjectKey(validating: cleanPrefix + "/x", maxLength: limits.maxKeyLength, maxSegmentLength: limits.maxKeySegmentLength)
            } catch {
                throw PlanError(description: "--prefix \"\(prefix ?? "")\" cannot begin a key: \(error.reason)")
            }
        }
        if paths.contains("-") && stdinName == nil {
            throw PlanError(description: "reading stdin (-) needs --name KEY for the stored object")
        }
        if let name = stdinName, !paths.contains("-") {
            throw PlanError(description: "--name \(name) names stdin, but no - was given among the paths")
        }
        var plan = Plan(items: [], results: [])
        // By the key's bytes (SPEC §12.2): Swift's String equality is canonical equivalence, under which an NFC and an
        // NFD name (two files, two keys) are one.
        var seen: [[UInt8]: String] = [:]
        func add(_ key: String, _ display: String, _ source: any BlobSource, fingerprint: [UInt8]?, size: UInt64?) {
            let full = Self.prefixed(key, cleanPrefix)
            do {
                _ = try ObjectKey(validating: full, maxLength: limits.maxKeyLength, maxSegmentLength: limits.maxKeySegmentLength)
            } catch {
                plan.results.append(
                    .failed(
                        key: full, path: display, error: "key \"\(full)\" is not allowed: \(error.reason) (rename it, or use --prefix/--name)",
                        code: UploadResult.ErrorCode.invalidKey
                    )
                )
                return
            }
            if let other = seen[Array(full.utf8)] {
                plan.results.append(
                    .failed(
                        key: full, path: display, error: "\(other) is stored as \"\(full)\" already in this run; not both",
                        code: UploadResult.ErrorCode.invalidKey)
                )
                return
            }
            seen[Array(full.utf8)] = display
            plan.items.append(UploadItem(key: full, displayPath: display, source: source, expectedFingerprint: fingerprint))
            plan.sizes.append(size)
            plan.fileBytes = size.flatMap { size in plan.fileBytes.map { $0 + size } }
        }
        for path in paths {
            if path == "-" {
                add(stdinName ?? "-", "-", StreamSource(), fingerprint: nil, size: nil)
                continue
            }
            if notUTF8.contains(path) {
                plan.results.append(.skipped(path: path, reason: "\(path): \(DirectoryWalker.notUTF8)"))
                continue
            }
            let walker = DirectoryWalker(followSymlinks: followSymlinks)
            let trimmed = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
            let absolute = Self.absolute(trimmed)
            let name = Self.name(absolute)
            guard !name.isEmpty, name != "/" else {
                // Keys are paths from a directory's parent: the root has no name to begin them.
                throw PlanError(description: "\(path) names the root directory: name a directory below it (keys begin with its name)")
            }
            // A trailing slash names the directory a link points to, as the shell and POSIX read it.
            switch walker.classify(absolute, following: followSymlinks || path.hasSuffix("/")) {
            case .missing(let reason):
                plan.results.append(.failed(key: "", path: path, error: "\(path): \(reason)", code: UploadResult.ErrorCode.sourceError))
            case .skip(let reason):
                plan.results.append(.skipped(path: path, reason: "\(path): \(reason)"))
            case .file(let fingerprint, let size):
                add(name, path, FileSource(path: absolute, followSymlinks: followSymlinks), fingerprint: fingerprint, size: size)
            case .directory:
                // Keys are paths from the directory's parent: `send photos` stores photos/...
                walker.walk(absolute, relative: name, display: trimmed, followingRoot: followSymlinks || path.hasSuffix("/")) { found in
                    switch found {
                    case .file(let fullPath, let relative, let display, let fingerprint, let size):
                        add(relative, display, FileSource(path: fullPath, followSymlinks: followSymlinks), fingerprint: fingerprint, size: size)
                    case .skipped(let display, let reason):
                        plan.results.append(.skipped(path: display, reason: "\(display): \(reason)"))
                    }
                }
            }
        }
        return plan
    }
}
