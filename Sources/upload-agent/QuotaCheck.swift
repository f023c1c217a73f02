import Logging
import UploadAgent
import UploadCommandLine
import UploadProtocol

/// `send`'s check of its whole selection against the account's quota before anything is sent (SPEC §7.2): which items
/// go, which are held back (each with its result), and what to tell the person.
struct QuotaCheck {
    /// The items to send.
    var items: [UploadItem]
    /// The items held back, failed with QUOTA_EXCEEDED.
    var held: [UploadResult]
    /// One line for the terminal when something was held back.
    var note: String?
    /// The bytes of ``items`` as the walk saw them (nil if one is a stream).
    var itemBytes: UInt64? = nil

    /// Asks the relay; when it cannot answer (it is older, or unreachable: the upload then says so), every item goes.
    /// The connection asked on stays up for the upload that follows (``Uploader/quotaPlan(_:keepConnection:)``).
    static func run(_ plan: ItemPlanner.Plan, sendWhatFits: Bool, overwrite: Bool, uploader: Uploader) async -> QuotaCheck {
        let all = QuotaCheck(items: plan.items, held: [], note: nil)
        // Streams have no size to plan with: they go, and the relay bounds them as they arrive.
        let sized = zip(plan.items.indices, plan.sizes).compactMap { index, size in size.map { (index: index, size: $0) } }
        guard !sized.isEmpty else { return all }
        let planned = sized.map(\.index)
        let request = QuotaPlan.Request(entries: sized.map { (plan.items[$0.index].key, $0.size) }, overwrite: overwrite)
        let answer: QuotaPlan?
        do {
            answer = try await uploader.quotaPlan(request, keepConnection: true)
        } catch {
            Logger(label: "upload-agent").debug("no quota check", metadata: ["error": "\(error)"])
            return all
        }
        guard let answer, !answer.fits, let left = answer.left, let quota = answer.quota else { return all }
        return Self.decide(plan, planned: planned, answer: answer, left: left, quota: quota, sendWhatFits: sendWhatFits)
    }

    static func decide(
        _ plan: ItemPlanner.Plan, planned: [Int], answer: QuotaPlan, left: UInt64, quota: UInt64, sendWhatFits: Bool
    ) -> QuotaCheck {
        func bytes(_ count: UInt64) -> String { Format.bytes(Int64(clamping: count)) }
        let overflow = Set(answer.overflow.map { planned[$0] })
        let need = Dictionary(uniqueKeysWithValues: zip(planned, answer.needs))
        let account = answer.account.isEmpty ? "the account" : "account \"\(answer.account)\""
        let room = "\(bytes(left)) of its \(bytes(quota)) quota left"
        let code = WireErrorCode.quotaExceeded.name
        var check = QuotaCheck(items: [], held: [], note: nil)
        var sizes: UInt64? = 0
        for (index, item) in plan.items.enumerated() {
            let size = plan.sizes[index]
            let fits = !overflow.contains(index)
            if fits && sendWhatFits {
                check.items.append(item)
                sizes = size.flatMap { size in sizes.map { $0 + size } }
                continue
            }
            let needs = need[index] ?? size ?? 0
            // A file smaller than the room left is left out for the files that fit before it (QuotaPlan.overflow: in order).
            let why =
                needs > left
                ? "\(account) has \(room)" : "the files that fit take the \(bytes(left)) \(account) has left of its \(bytes(quota)) quota"
            let message =
                fits
                ? "QUOTA_EXCEEDED: not sent: the selection needs \(bytes(answer.needed)) and \(account) has \(room); --send-what-fits sends the files that fit"
                : "QUOTA_EXCEEDED: does not fit: it needs \(bytes(needs)) and \(why) (the selection needs \(bytes(answer.needed)))"
            check.held.append(.failed(key: item.key, path: item.displayPath, error: message, code: code))
        }
        check.itemBytes = sizes
        let fix = "free space (upload-relay rm), raise the quota (upload-relay token quota)"
        if sendWhatFits {
            check.note =
                "\(overflow.count) of \(plan.items.count) files do not fit: \(account) has \(room); sending the \(check.items.count) that fit (to send the rest, \(fix))"
        } else {
            check.note =
                "nothing was sent: the selection needs \(bytes(answer.needed)) and \(account) has \(room); \(overflow.count) of \(plan.items.count) files do not fit. To go on, \(fix), or pass --send-what-fits"
        }
        return check
    }
}
