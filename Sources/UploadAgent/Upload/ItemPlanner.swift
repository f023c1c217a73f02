import Foundation
import UploadProtocol

/// Turns what the user named on the command line into upload items with keys.
///
/// A file's key is its base name; a directory is walked recursively and each file's key is its
/// path relative to the directory's parent (`send dir` stores `dir/a/b.jpg`); `-` is stdin and
/// needs `name`. `prefix` goes in front of every key.
public enum ItemPlanner {
    public struct PlanError: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// The key of a file at `relative` (from a watched directory's parent) under `prefix`, or why it cannot be one.
    public static func key(relative: String, prefix: String?, limits: ProtocolLimits = ProtocolLimits()) throws -> String {
        let cleanPrefix = prefix.map { $0.split(separator: "/").joined(separator: "/") }.flatMap { $0.isEmpty ? nil : $0 }
        let full = cleanPrefix.map { $0 + "/" + relative } ?? relative
        do {
            _ = try ObjectKey(validating: full, maxLength: limits.maxKeyLength, maxSegmentLength: limits.maxKeySegmentLength)
        } catch {
            throw PlanError(description: "key \"\(full)\" is not allowed: \(error.reason) (rename the file, or change --prefix)")
        }
        return full
    }

    public static func plan(paths: [String], prefix: String?, stdinName: String?, limits: ProtocolLimits = ProtocolLimits()) throws -> [UploadItem] {
        var items: [UploadItem] = []
        var seen: [String: String] = [:]
        let cleanPrefix = prefix.map { $0.split(separator: "/").joined(separator: "/") }.flatMap { $0.isEmpty ? nil : $0 }
        func add(_ key: String, _ display: String, _ source: any BlobSource) throws {
            let full = cleanPrefix.map { $0 + "/" + key } ?? key
            do {
                _ = try ObjectKey(validating: full, maxLength: limits.maxKeyLength, maxSegmentLength: limits.maxKeySegmentLength)
            } catch {
                throw PlanError(description: "\(display): key \"\(full)\" is not allowed: \(error.reason) (rename it, or use --prefix/--name)")
            }
            if let other = seen[full] {
                throw PlanError(description: "\(display) and \(other) would both be stored as \"\(full)\"")
            }
            seen[full] = display
            items.append(UploadItem(key: full, displayPath: display, source: source))
        }
        for path in paths {
            if path == "-" {
                guard let name = stdinName else {
                    throw PlanError(description: "reading stdin (-) needs --name KEY for the stored object")
                }
                try add(name, "-", StreamSource())
                continue
            }
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                throw PlanError(description: "\(path): no such file or directory")
            }
            let trimmed = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
            if isDirectory.boolValue {
                let base = URL(fileURLWithPath: trimmed).standardizedFileURL
                let parentLength = base.deletingLastPathComponent().path.count
                var files: [String] = []
                guard let walker = FileManager.default.enumerator(atPath: trimmed) else {
                    throw PlanError(description: "\(path): cannot list the directory")
                }
                while let relative = walker.nextObject() as? String {
                    let full = trimmed + "/" + relative
                    var sub: ObjCBool = false
                    if FileManager.default.fileExists(atPath: full, isDirectory: &sub), !sub.boolValue,
                        (try? FileManager.default.attributesOfItem(atPath: full)[.type] as? FileAttributeType) == .typeRegular
                    {
                        files.append(relative)
                    }
                }
                for relative in files.sorted() {
                    let fullPath = trimmed + "/" + relative
                    let absolute = base.appendingPathComponent(relative).path
                    var key = String(absolute.dropFirst(parentLength))
                    while key.hasPrefix("/") { key.removeFirst() }
                    try add(key, fullPath, FileSource(path: fullPath))
                }
            } else {
                try add(URL(fileURLWithPath: trimmed).lastPathComponent, path, FileSource(path: path))
            }
        }
        if let name = stdinName, !paths.contains("-") {
            throw PlanError(description: "--name \(name) names stdin, but no - was given among the paths")
        }
        return items
    }
}
