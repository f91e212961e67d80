"""Word pools the generator samples from. Plain tuples: order is fixed, so sampling is deterministic."""

FIRST_NAMES = (
    "Alice", "Bruno", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Isabel", "Jamal", "Kira", "Liam",
    "Maya", "Nikolai", "Olivia", "Pedro", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wes", "Ximena",
    "Yusuf", "Zoe", "Amara", "Ben", "Carmen", "Dev", "Emeka", "Fiona", "Gus", "Hana", "Ivan", "Julia",
)  # fmt: skip
LAST_NAMES = (
    "Adams", "Baker", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen", "Khan", "Lopez",
    "Moreau", "Nakamura", "Okafor", "Patel", "Quist", "Rossi", "Silva", "Tanaka", "Ueda", "Vargas", "Weber",
    "Young", "Zhang", "Novak", "Kowalski", "Murphy", "Ahmed", "Berg",
)  # fmt: skip
DOMAINS = ("pocketmail.com", "inbox.net", "mailbox.org")
RELATIONSHIP_COUNTS = (("roommate", 2), ("family", 5), ("friend", 8), ("coworker", 7))

GENRES = ("pop", "rock", "jazz", "hip-hop", "classical", "electronic", "country", "indie")
ARTIST_NAMES = (
    "The Night Owls", "Luna Park", "Marco Vell", "Static Bloom", "Ada Rivers", "Blue Harbor", "Kofi Mensah",
    "Paper Lanterns", "Iris Kwan", "The Foxgloves", "DJ Meridian", "Sol & Sea", "Hollow Pines", "Nadia Frost",
    "Echo Valley", "Rui Santos", "Velvet Arcade", "Oskar Lind",
)  # fmt: skip
SONG_ADJ = (
    "Golden", "Midnight", "Electric", "Silent", "Wild", "Broken", "Neon", "Endless", "Falling", "Lonely",
    "Summer", "Crystal", "Hidden", "Burning", "Paper", "Velvet", "Distant", "Restless",
)  # fmt: skip
SONG_NOUN = (
    "Hearts", "Skies", "River", "Dreams", "Echoes", "Lights", "Roads", "Waves", "Shadows", "Fire", "Garden",
    "Stars", "Rain", "Mirror", "Horizon", "Whispers",
)  # fmt: skip
PLAYLIST_TITLES = (
    "Road Trip",
    "Workout",
    "Chill Evening",
    "Focus",
    "Party Mix",
    "Morning Coffee",
    "Rainy Day",
    "Throwbacks",
)

PAYMENT_NOTES = (
    "dinner", "movie tickets", "groceries", "concert", "rent share", "coffee", "gas money", "birthday gift",
    "pizza night", "utilities", "taxi", "book club",
)  # fmt: skip
TEXT_LINES = (
    "Are we still on for tomorrow?", "Running 10 minutes late!", "Did you see the game last night?",
    "Can you call me when you're free?", "Thanks again for dinner!", "Happy Friday!", "Just landed.",
    "Don't forget the keys.", "Let's grab lunch this week.", "Sent you the photos.",
)  # fmt: skip
ALARM_LABELS = ("Wake up", "Gym", "Meds", "Standup", "Pick up kids", "Water plants", "Leave for work")
EMAIL_SUBJECTS = (
    "Quarterly report", "Weekend plans", "Invoice #{n}", "Project kickoff", "Team offsite", "Photos from the trip",
    "Book recommendation", "Dinner on Saturday?", "Budget review", "Your order has shipped", "Meeting notes",
    "Welcome aboard", "Flight itinerary", "Reminder: dentist appointment", "Newsletter #{n}",
)  # fmt: skip
EMAIL_BODIES = (
    "Please find the details below. Let me know what you think.", "Looking forward to it!",
    "Can you take a look before Friday?", "Here is the summary we discussed.", "Let me know if this works for you.",
)  # fmt: skip
SERVICE_SENDERS = (("newsletter@dailybrief.com", "Daily Brief"), ("noreply@pocketbank.com", "Pocket Bank"))

NOTE_TAGS = ("recipes", "work", "ideas", "travel", "books", "shopping", "health")
NOTE_TITLES = (
    "Pasta recipe", "Sprint goals", "App idea", "Packing list", "Books to read", "Gift ideas", "Workout plan",
    "Meeting prep", "Garden plans", "Lisbon trip", "Soup recipe", "Podcast list", "Budget 2026", "Reading notes",
    "Weekend errands", "Interview questions",
)  # fmt: skip
TODO_LISTS = ("Personal", "Work", "Home", "Errands")
TODO_TITLES = (
    "Pay electricity bill", "Book dentist", "Renew passport", "Clean garage", "Call the bank", "Buy printer ink",
    "Submit expense report", "Prepare slides", "Water the plants", "Fix bike tire", "Order birthday cake",
    "Update resume", "Return library books", "Schedule car service", "Back up laptop", "Plan team lunch",
    "Reply to landlord", "Cancel gym trial", "Pick up dry cleaning", "Review contract",
)  # fmt: skip

PRODUCT_CATEGORIES = ("electronics", "books", "kitchen", "sports", "toys", "beauty", "garden")
PRODUCT_WORDS = {
    "electronics": (
        "Wireless Earbuds",
        "USB-C Charger",
        "Smart Speaker",
        "Phone Stand",
        "Power Bank",
        "Webcam",
    ),
    "books": (
        "Mystery Novel",
        "Cookbook",
        "Travel Guide",
        "Poetry Collection",
        "Sci-Fi Epic",
        "History Atlas",
    ),
    "kitchen": ("Chef Knife", "French Press", "Cast Iron Pan", "Spice Rack", "Cutting Board", "Tea Kettle"),
    "sports": ("Yoga Mat", "Running Socks", "Water Bottle", "Jump Rope", "Tennis Balls", "Bike Light"),
    "toys": ("Puzzle Set", "Building Blocks", "Plush Bear", "Kite", "Board Game", "Toy Train"),
    "beauty": ("Face Cream", "Shampoo Bar", "Lip Balm", "Sunscreen", "Hair Brush", "Bath Salts"),
    "garden": ("Seed Pack", "Garden Gloves", "Watering Can", "Plant Pot", "Pruning Shears", "Bird Feeder"),
}
FILE_DIRS = {
    "/documents": ("txt", "pdf", "docx"),
    "/documents/taxes": ("pdf", "csv"),
    "/photos": ("jpg", "png"),
    "/photos/trips": ("jpg",),
    "/downloads": ("pdf", "zip", "jpg", "csv"),
    "/work": ("docx", "txt", "csv"),
}
FILE_STEMS = (
    "report", "invoice", "notes", "summary", "receipt", "plan", "budget", "draft", "scan", "photo", "letter",
    "contract", "agenda", "list", "statement", "slides",
)  # fmt: skip
GROUP_NAMES = ("Apartment", "Ski Trip", "Office Lunch")
EXPENSE_ITEMS = (
    "Groceries",
    "Internet bill",
    "Cleaning supplies",
    "Dinner",
    "Cabin rental",
    "Gas",
    "Lunch",
    "Snacks",
    "Lift tickets",
    "Pizza",
)
